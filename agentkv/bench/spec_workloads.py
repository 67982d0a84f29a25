"""The workloads of `agentkv bench spec`: agent sessions, each a list of user turns; every
turn's prompt is the session so far through the model's chat template, the assistant's
earlier answers included (as the arm itself produced them).

  tool-copy   one turn each: repeat or edit a tool result (a file, a JSON record) the model
              has not written; small models paraphrase these, so fewer tokens are copyable
  revise      one session: the agent edits a file from a tool result, then the tool reports a
              problem three times and the agent writes the whole file again each time, so each
              answer repeats or edits its own previous one (how a coding agent iterates)
  open-ended  one turn each: answers the context cannot predict (stories, explanations)

`predictable` measures how copy-heavy a workload really is: the share of answer tokens that
prompt lookup (the longest earlier 2..5-gram match in the turn's own prompt and answer so far)
would have proposed as its first draft token."""

from __future__ import annotations

from agentkv.sched.draft import NgramIndex

FILE = (
    "import json\nfrom pathlib import Path\n\n\ndef load_config(path):\n"
    '    """Read the JSON config at path and check its version."""\n'
    "    data = json.loads(Path(path).read_text())\n    if data.get('version') != 2:\n"
    "        raise ValueError(f'unsupported config version: {data.get(\"version\")}')\n"
    "    return data\n\n\ndef save_config(path, data):\n"
    "    Path(path).write_text(json.dumps(data, indent=2))\n"
)
RECORD = '{"id": 4821, "name": "disk-usage", "status": "ok", "hosts": ["web-1", "web-2", "db-1"], "used_gb": 412}'
TOOL_COPY = (
    (f"Tool result (read_file config.py):\n{FILE}\nRepeat the file exactly, with no comment.",),
    (f"Tool result (read_file config.py):\n{FILE}\nRewrite the file with load_config renamed to read_config.",),
    (f'Tool result (get_check):\n{RECORD}\nReturn the same JSON record with status set to "failed".',),
    (f"Tool result (read_file config.py):\n{FILE}\nShow the file again with version 2 changed to 3.",),
)
REVISE = (
    (
        f"Tool result (read_file config.py):\n{FILE}\nRewrite the file with load_config renamed to read_config.",
        "Tool result (run_tests): 1 failed, a syntax error. Write the whole file again, corrected.",
        "Tool result (run_linter): save_config is not a good name. Show the complete file once more, "
        "with save_config renamed to write_config.",
        "Tool result (write_file): permission denied. Print the full file again so I can save it by hand.",
    ),
)
OPEN_ENDED = (
    ("Write a short story about a robot who learns to paint.",),
    ("Explain why the sky is blue to a ten-year-old.",),
    ("Give three ideas for a weekend trip near the mountains.",),
    ("Describe your ideal breakfast in a few sentences.",),
)
WORKLOADS = {"tool-copy": TOOL_COPY, "revise": REVISE, "open-ended": OPEN_ENDED}


def limit_turns(sessions: tuple[tuple[str, ...], ...], turns: int) -> tuple[tuple[str, ...], ...]:
    """At most `turns` turns in all, taken session by session in order."""
    out, left = [], turns
    for session in sessions:
        if left <= 0:
            break
        out.append(session[:left])
        left -= len(out[-1])
    return tuple(out)


def predictable(prompt: list[int], answer: list[int]) -> int:
    """How many answer tokens prompt lookup's first draft token would have been (see above)."""
    index = NgramIndex(2, 5)
    index.extend(prompt)
    hits = 0
    for token in answer:
        n, end = index.match(index.tokens)
        hits += bool(n) and index.tokens[end] == token
        index.extend([token])
    return hits
