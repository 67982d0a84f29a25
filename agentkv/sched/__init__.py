"""Continuous batching and chunked prefill (pure Python, no torch)."""

from agentkv.sched.config import CacheView, SchedulerConfig
from agentkv.sched.plan import ScheduledChunk, SchedulerOutput
from agentkv.sched.scheduler import Scheduler
from agentkv.sched.sequence import SeqId, SeqStatus, Sequence

__all__ = [
    "CacheView",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SeqId",
    "SeqStatus",
    "Sequence",
]
