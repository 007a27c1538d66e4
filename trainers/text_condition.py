"""Text conditioning for the Cosmos transformer, from the best source there is, recorded per file.

1. precomputed prompt embeddings when the episode data has them: card B's ``prompt_embeddings/``
   (beside ``data.episodes``, or under the latent cache's ``.../robocasa_hdf5/``), one safetensors
   file per demo (``<demo>.safetensors``) or one for all (``default.safetensors``), holding a
   ``prompt_embeds`` tensor (S, D) — what the pipeline's T5 produced, zeroed past the prompt;
2. a local T5 encoder directory (``--text-encoder-dir``: ``text_encoder/`` + ``tokenizer/``, as the
   Cosmos repositories lay them out), run on the demo's language instruction (RoboCasa's
   ``ep_meta["lang"]``, else the env name) the way the pipeline does (max length 512, padding zeroed);
3. zeros (1, 1, D) only when neither is there.

The source is written into every cache file (``text_conditioning``): ``prompt_embeddings:<dir>``,
``t5:<dir>`` or ``zeros``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cache.episodes import EpisodeFile
from ground.errors import UserError
from ground.paths import expand_path
from ground.spec.schema import ExperimentSpec

PROMPT_DIR = "prompt_embeddings"
PROMPT_KEY = "prompt_embeds"
DEFAULT_FILE = "default.safetensors"
MAX_TOKENS = 512


def prompt_dirs(spec: ExperimentSpec) -> list[Path]:
    """Where card B keeps precomputed prompt embeddings, in the order they are looked for."""
    dirs = [expand_path(spec.data.episodes).parent / PROMPT_DIR]
    if spec.latent is not None:
        from cache.latent.layout import LatentLayout

        dirs.append(LatentLayout.from_spec(spec.latent).prompt_embeddings_dir)
    return dirs


class TextConditioning:
    """``for_demo(episodes, demo)`` → (1, S, text_dim) float32; ``source`` says where it came from."""

    def __init__(self, spec: ExperimentSpec, text_dim: int, text_encoder_dir: str | None = None):
        self.text_dim = text_dim
        self._dir = next((d for d in prompt_dirs(spec) if d.is_dir()), None)
        self._t5: tuple[Any, Any] | None = None
        if text_encoder_dir is None and spec.data.text_encoder is not None:  # a --text-encoder-dir flag wins
            text_encoder_dir = str(expand_path(spec.data.text_encoder))
        if self._dir is not None:
            self.source = f"prompt_embeddings:{self._dir}"
        elif text_encoder_dir is not None:
            self._t5 = _load_t5(Path(text_encoder_dir))
            self.source = f"t5:{Path(text_encoder_dir)}"
        else:
            self.source = "zeros"

    def for_demo(self, episodes: EpisodeFile, demo: str) -> torch.Tensor:
        if self._dir is not None:
            return self._precomputed(demo)
        if self._t5 is not None:
            return self._encode(_instruction(episodes, demo))
        return torch.zeros(1, 1, self.text_dim)

    def _precomputed(self, demo: str) -> torch.Tensor:
        from safetensors.torch import load_file

        assert self._dir is not None
        path = self._dir / f"{demo}.safetensors"
        if not path.exists():
            path = self._dir / DEFAULT_FILE
        if not path.exists():
            raise UserError(f"no prompt embedding for {demo} ({demo}.safetensors or {DEFAULT_FILE})", file=str(self._dir),
                            field=PROMPT_DIR, hint="write it, or move the directory away to use T5 / zeros")
        tensors = load_file(path)
        embeds = tensors.get(PROMPT_KEY, next(iter(tensors.values())) if len(tensors) == 1 else None)
        if embeds is None or embeds.ndim not in (2, 3) or embeds.shape[-1] != self.text_dim:
            shape = None if embeds is None else tuple(embeds.shape)
            raise UserError(f"prompt embedding is {shape}, the transformer wants (S, {self.text_dim})", file=str(path),
                            field=PROMPT_KEY, hint="recompute it with the transformer's text encoder")
        return embeds.reshape(1, -1, self.text_dim).float()

    @torch.no_grad()
    def _encode(self, prompt: str) -> torch.Tensor:
        assert self._t5 is not None
        tokenizer, encoder = self._t5
        tokens = tokenizer([prompt], padding="max_length", max_length=MAX_TOKENS, truncation=True,
                           return_tensors="pt")
        mask = tokens.attention_mask.bool()
        embeds = encoder(tokens.input_ids, attention_mask=mask).last_hidden_state.float()
        embeds[0, int(mask.sum()):] = 0  # the pipeline zeroes the padding positions
        if embeds.shape[-1] != self.text_dim:
            raise UserError(f"T5 gives {embeds.shape[-1]}-wide embeddings, the transformer wants {self.text_dim}",
                            field="data.text_encoder", hint="use the text encoder the transformer was trained with")
        return embeds


def _instruction(episodes: EpisodeFile, demo: str) -> str:
    group = episodes.handle[f"data/{demo}"]
    meta = group.attrs.get("ep_meta")
    if meta:
        lang = json.loads(meta).get("lang")
        if lang:
            return str(lang)
    return str(episodes.env_args().get("env_name", ""))


def _load_t5(folder: Path) -> tuple[Any, Any]:
    if not folder.is_dir():
        raise UserError("text encoder directory does not exist", file=str(folder), field="data.text_encoder",
                        hint="give a local folder holding text_encoder/ and tokenizer/")
    try:
        from transformers import AutoTokenizer, T5EncoderModel
    except ImportError:
        raise UserError("the T5 text encoder needs the `transformers` package, which is not installed",
                        file=str(folder), field="data.text_encoder",
                        hint="install transformers, or precompute prompt_embeddings/ elsewhere") from None
    encoder_dir = folder / "text_encoder" if (folder / "text_encoder").is_dir() else folder
    tokenizer_dir = folder / "tokenizer" if (folder / "tokenizer").is_dir() else folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    encoder = T5EncoderModel.from_pretrained(encoder_dir, local_files_only=True).eval().requires_grad_(False)
    return tokenizer, encoder
