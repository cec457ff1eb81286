"""Dumping: how a side's run becomes a dump on disk. The driver (:mod:`.driver`) runs a family's
code; storage types and their emulation (:mod:`.storage`), dumps (:mod:`.artifacts`), their
caches, the crash guard, the inputs (:mod:`.audio`), memory and thread settings, provenance."""
