"""Records and queries: what a forward pass gives (:class:`AttentionRecord`, the windowed record in
``records.windowed``), the checks of a record, and the rows an analysis reads from it (``queries``).

``analysis.records`` was one module before the layer folders; its names are here as before.
"""

from .attention import AttentionRecord, AttentionRecordProtocol

__all__ = ["AttentionRecord", "AttentionRecordProtocol"]
