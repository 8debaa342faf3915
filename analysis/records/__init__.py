"""Records and queries: what a forward pass gives (:mod:`analysis.records.attention`, the windowed
record in :mod:`analysis.records.windowed`), the checks of a record (:mod:`analysis.records.checks`),
and the rows an analysis reads from it (:mod:`analysis.records.queries`). Import each name from its
module.
"""
