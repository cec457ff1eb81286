"""``MossTTSDelayConfig``: the checkpoint config (mirrors OpenMOSS ``configuration_moss_tts.py``).

Field names and meanings as upstream: ``n_vq`` codebooks of ``audio_vocab_size`` codes plus one
pad code (``audio_pad_code``), the special text token ids, and ``language_config`` (a
``Qwen3Config``). No defaults for the token ids: a checkpoint must spell them out.
"""

from transformers import PretrainedConfig, Qwen3Config


class MossTTSDelayConfig(PretrainedConfig):
    """Config of a ``MossTTSDelayModel`` (a Qwen3 backbone plus per-codebook embeddings/heads)."""

    model_type = "moss_tts_delay"
    sub_configs = {"language_config": Qwen3Config}

    def __init__(
        self,
        language_config=None,
        n_vq: int = 16,
        audio_vocab_size: int = 1024,
        audio_pad_code: int = 1024,
        pad_token_id: int | None = None,
        im_start_token_id: int | None = None,
        im_end_token_id: int | None = None,
        audio_start_token_id: int | None = None,
        audio_end_token_id: int | None = None,
        audio_user_slot_token_id: int | None = None,
        audio_assistant_gen_slot_token_id: int | None = None,
        audio_assistant_delay_slot_token_id: int | None = None,
        sampling_rate: int = 24000,
        **kwargs,
    ):
        if isinstance(language_config, dict):
            language_config = Qwen3Config(**language_config)
        self.language_config = language_config if language_config is not None else Qwen3Config()
        self.n_vq = n_vq
        self.audio_vocab_size = audio_vocab_size
        self.audio_pad_code = audio_pad_code
        self.im_start_token_id = im_start_token_id
        self.im_end_token_id = im_end_token_id
        self.audio_start_token_id = audio_start_token_id
        self.audio_end_token_id = audio_end_token_id
        self.audio_user_slot_token_id = audio_user_slot_token_id
        self.audio_assistant_gen_slot_token_id = audio_assistant_gen_slot_token_id
        self.audio_assistant_delay_slot_token_id = audio_assistant_delay_slot_token_id
        self.sampling_rate = sampling_rate
        self.hidden_size = self.language_config.hidden_size
        self.vocab_size = self.language_config.vocab_size
        super().__init__(pad_token_id=pad_token_id, **kwargs)

    def to_dict(self):
        output = super().to_dict()
        output["language_config"] = self.language_config.to_dict()
        return output
