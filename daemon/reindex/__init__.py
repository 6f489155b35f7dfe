"""`agentmemd reindex`: rebuild the index from Kafka into a new generation, then switch.

The façade of the steps and their parts (``memory.generations`` has the model):

- ``start``: :func:`reindex`, the checks before the model loads, and the run;
- ``build``: one run, :class:`~daemon.reindex.build.Reindex`, whose methods are the steps
  but 6 and 7 (its docstring lists them and says why each is there);
- ``slot``: the build slot, reserved, kept by a heartbeat, switched through and released;
- ``replay``: the source topics read into the new generation;
- ``summaries``: community summaries copied over at their fencing tokens;
- ``completeness``: what the new generation lacks of the old, and copying it over;
- ``handover``: after the switch, the catch-up and the old generation dropped or kept
  (steps 6 and 7, :class:`~daemon.reindex.handover.Handover`);
- ``repoint``: the graph re-pointed at new chunks; ``drop``: a kept generation dropped;
- ``report``: the progress and the report a caller sees.
"""

from daemon.reindex.completeness import Carry, carry_mode
from daemon.reindex.drop import drop_generation
from daemon.reindex.replay import source_topics
from daemon.reindex.repoint import repoint_graph
from daemon.reindex.report import ReindexProgress, ReindexReport
from daemon.reindex.start import reindex

__all__ = [
    "Carry",
    "ReindexProgress",
    "ReindexReport",
    "carry_mode",
    "drop_generation",
    "reindex",
    "repoint_graph",
    "source_topics",
]
