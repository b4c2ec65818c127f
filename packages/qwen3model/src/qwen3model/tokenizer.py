"""`Tokenizer`: a Hugging Face `tokenizer.json` plus its chat template, end-of-sequence ids and a
streaming decoder; `Tokenizer.byte_level()` builds the byte tokenizer of the synthetic models."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

__all__ = ["BYTE_SPECIAL_TOKENS", "StreamDecoder", "Tokenizer"]

# The specials Qwen3 uses; the byte tokenizer gives them ids 256, 257, 258.
BYTE_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_REPLACEMENT_CHAR = "\ufffd"


@cache
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map that ByteLevel models use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    unprintable = [b for b in range(256) if b not in mapping]
    mapping.update({b: chr(256 + n) for n, b in enumerate(unprintable)})
    return mapping


def _raise_template_error(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class Tokenizer:
    """Text <-> token ids for one model, with its chat template and end-of-sequence ids.

    Args:
        backend: The `tokenizers.Tokenizer` doing the work.
        eos_token_ids: Ids that end generation (may be empty).
        chat_template: A Jinja chat template (Hugging Face semantics), or None.
        special_tokens: Named specials the template may use (`bos_token`, `eos_token`).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self._backend = backend
        self.eos_token_ids = frozenset(eos_token_ids)
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """The synthetic models' tokenizer: ids 0..255 are bytes, then `BYTE_SPECIAL_TOKENS`.

        Every string round-trips exactly; ids past the vocabulary decode to nothing.
        """
        vocab = {char: byte for byte, char in _byte_to_unicode().items()}
        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens(list(BYTE_SPECIAL_TOKENS))
        eos = [backend.token_to_id("<|endoftext|>"), backend.token_to_id("<|im_end|>")]
        return cls(backend, eos_token_ids=eos, special_tokens={"eos_token": "<|endoftext|>"})

    @classmethod
    def from_directory(cls, directory: str | Path) -> Tokenizer:
        """Loads `tokenizer.json` and, when present, `tokenizer_config.json` (chat template,
        `eos_token`), `chat_template.jinja` and `generation_config.json` (`eos_token_id`).

        Raises:
            FileNotFoundError: `tokenizer.json` is missing (the message names the path).
        """
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer at {path} (expected a Hugging Face tokenizer.json)"
            )
        backend = tokenizers.Tokenizer.from_file(str(path))
        config = _read_json(directory / "tokenizer_config.json")
        specials = {
            name: _token_content(config[name])
            for name in ("bos_token", "eos_token")
            if config.get(name) is not None
        }
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        template_file = directory / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        eos_ids = set()
        if "eos_token" in specials and backend.token_to_id(specials["eos_token"]) is not None:
            eos_ids.add(backend.token_to_id(specials["eos_token"]))
        generation_eos = _read_json(directory / "generation_config.json").get("eos_token_id")
        if generation_eos is not None:
            eos_ids.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
        return cls(backend, eos_token_ids=eos_ids, chat_template=template, special_tokens=specials)

    def save(self, directory: str | Path) -> None:
        """Writes `tokenizer.json` and `tokenizer_config.json` into an existing directory."""
        directory = Path(directory)
        self._backend.save(str(directory / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **self.special_tokens,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        if self.eos_token_ids:
            generation = {"eos_token_id": sorted(self.eos_token_ids)}
            (directory / "generation_config.json").write_text(
                json.dumps(generation, indent=2) + "\n"
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (specials included)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        """Whether `apply_chat_template` can run (instruct checkpoints ship a template)."""
        return self.chat_template is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in the text map to their ids."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`; special tokens are kept, unknown ids are skipped."""
        return self._backend.decode(list(token_ids), skip_special_tokens=False)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Renders a conversation with the model's chat template, as `transformers` does.

        Args:
            messages: `{"role": ..., "content": ...}` dicts.
            add_generation_prompt: End with the assistant header so the model answers.
            **template_kwargs: Extra template variables (Qwen3: `enable_thinking`).

        Raises:
            ValueError: The tokenizer has no chat template.
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json)")
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True
        )
        environment.globals["raise_exception"] = _raise_template_error
        environment.filters["tojson"] = _tojson
        template = environment.from_string(self.chat_template)
        return template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
            **template_kwargs,
        )


class StreamDecoder:
    """Turns a stream of token ids into text pieces, holding back incomplete UTF-8 sequences.

    Decoding pending ids together and emitting only once the text is complete is exact for
    byte-level BPE tokenizers (GPT-2 style, as Qwen's), whose pieces concatenate.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []

    def add(self, token_id: int) -> str:
        """Feeds one id; returns the text it completes (possibly empty)."""
        self._pending.append(token_id)
        text = self._tokenizer.decode(self._pending)
        if text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._pending.clear()
        return text

    def flush(self) -> str:
        """Returns whatever is still pending, decoded as-is."""
        text = self._tokenizer.decode(self._pending)
        self._pending.clear()
        return text


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_content(token: str | Mapping[str, Any]) -> str:
    # tokenizer_config.json writes specials either as strings or as AddedToken dicts.
    return token if isinstance(token, str) else str(token["content"])
