"""`agentmemd reindex`: rebuild the index from Kafka into a new generation, then switch.

The façade of the steps and their parts (``memory.generations`` has the model):

- ``build``: one run, :class:`~daemon.reindex.build.Reindex`, whose methods are the steps
  (its docstring lists them and says why each is there), and :func:`reindex` to start one;
- ``replay``: the source topics read into the new generation;
- ``summaries``: community summaries copied over at their fencing tokens;
- ``completeness``: what the new generation lacks of the old, and copying it over;
- ``repoint``: the graph re-pointed at new chunks; ``drop``: a kept generation dropped;
- ``report``: the progress and the report a caller sees.
"""

from daemon.reindex.build import reindex
from daemon.reindex.completeness import carry_mode
from daemon.reindex.drop import drop_generation
from daemon.reindex.replay import source_topics
from daemon.reindex.repoint import repoint_graph
from daemon.reindex.report import ReindexProgress, ReindexReport

__all__ = [
    "ReindexProgress",
    "ReindexReport",
    "carry_mode",
    "drop_generation",
    "reindex",
    "repoint_graph",
    "source_topics",
]
