"""The house's size rules, checked over the package, the benchmarks and the tools:
no module over 400 lines, no function over 60 lines, no function with more than 8 parameters
(except a Triton kernel, `@triton.jit`: its parameters are its launch ABI, which takes no
structs, so they are counted against the line limit only).

`python tools/style_check.py` prints every breach and exits 1 if there is one;
`--report` prints the counts (modules, longest, over the limits) and exits 0."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentkv", "bench", "tools")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller can pass (self/cls not counted; *args and **kwargs count one each)."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def is_triton_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(d).split("(")[0] in ("triton.jit", "jit") for d in fn.decorator_list)


def measure(path: Path) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(module lines, [(function name, first line, lines, parameters)])."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    functions = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            count = 0 if is_triton_kernel(node) else parameters(node)
            functions.append((node.name, node.lineno, length, count))
    return len(text.splitlines()), functions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="print counts, never fail")
    args = parser.parse_args(argv)
    breaches: list[str] = []
    module_lines, function_lines, params = [], [], []
    for path in python_files():
        rel = path.relative_to(ROOT)
        lines, functions = measure(path)
        module_lines.append(lines)
        if lines > MAX_MODULE_LINES:
            breaches.append(f"{rel}: {lines} lines (limit {MAX_MODULE_LINES})")
        for name, lineno, length, count in functions:
            function_lines.append(length)
            params.append(count)
            if length > MAX_FUNCTION_LINES:
                breaches.append(f"{rel}:{lineno} {name}: {length} lines (limit {MAX_FUNCTION_LINES})")
            if count > MAX_PARAMETERS:
                breaches.append(f"{rel}:{lineno} {name}: {count} parameters (limit {MAX_PARAMETERS})")
    if args.report:
        print(
            f"modules: {len(module_lines)}, longest {max(module_lines)} lines, "
            f"{sum(n > MAX_MODULE_LINES for n in module_lines)} over {MAX_MODULE_LINES}"
        )
        print(
            f"functions: {len(function_lines)}, longest {max(function_lines)} lines, "
            f"{sum(n > MAX_FUNCTION_LINES for n in function_lines)} over {MAX_FUNCTION_LINES}, "
            f"{sum(n > 50 for n in function_lines)} over 50"
        )
        print(
            f"parameters: most {max(params)}, {sum(n > MAX_PARAMETERS for n in params)} functions over {MAX_PARAMETERS}"
        )
    for line in breaches:
        print(line)
    return 0 if args.report or not breaches else 1


if __name__ == "__main__":
    sys.exit(main())
