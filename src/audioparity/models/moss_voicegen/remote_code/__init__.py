"""A small, self-contained PyTorch ``MossTTSDelayModel`` in the checkpoint's own code layout.

The three modules mirror the files a MOSS checkpoint ships for ``trust_remote_code``
(``configuration_moss_tts.py``, ``modeling_moss_tts.py``, ``processing_moss_tts.py``): the
built-in reference imports them directly when a checkpoint carries no code, and
:func:`audioparity.models.moss_voicegen.fixture.build_fixture` copies them into a fixture
(with ``auto_map``) to exercise the ``trust_remote_code`` path. They import only torch and
transformers (never ``audioparity``), as checkpoint code must.
"""

from pathlib import Path

#: The directory holding the checkpoint-style modules (copied into remote-code fixtures).
SOURCE_DIR = Path(__file__).resolve().parent
#: The files a remote-code checkpoint carries, and the ``auto_map`` entries pointing at them.
FILES = ("configuration_moss_tts.py", "modeling_moss_tts.py", "processing_moss_tts.py")
AUTO_MAP = {
    "AutoConfig": "configuration_moss_tts.MossTTSDelayConfig",
    "AutoModel": "modeling_moss_tts.MossTTSDelayModel",
}
PROCESSOR_AUTO_MAP = {"AutoProcessor": "processing_moss_tts.MossTTSDelayProcessor"}
