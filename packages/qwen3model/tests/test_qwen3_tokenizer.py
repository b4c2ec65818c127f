"""Tokenizer: the byte-level tokenizer, Hugging Face directories, chat templates, streaming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3model import StreamDecoder, Tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text: str) -> None:
    tokenizer = Tokenizer.byte_level()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    if "<|" not in text:
        assert ids == list(text.encode())


def test_byte_tokenizer_ids_are_bytes_then_specials() -> None:
    tokenizer = Tokenizer.byte_level()
    assert tokenizer.vocab_size == 259
    assert tokenizer.encode("A\n") == [65, 10]
    assert tokenizer.encode("<|im_start|>hi<|im_end|>") == [257, 104, 105, 258]
    assert tokenizer.eos_token_ids == {256, 258}


def test_ids_past_the_vocabulary_decode_to_nothing() -> None:
    tokenizer = Tokenizer.byte_level()
    assert tokenizer.decode([72, 151_000, 105, 300]) == "Hi"


def test_stream_decoder_holds_back_split_utf8() -> None:
    tokenizer = Tokenizer.byte_level()
    ids = tokenizer.encode("añ€!")
    decoder = StreamDecoder(tokenizer)
    pieces = [decoder.add(token) for token in ids]
    assert pieces == ["a", "", "ñ", "", "", "€", "!"]
    assert decoder.flush() == ""


def test_save_and_load_directory_round_trip(tmp_path: Path) -> None:
    tokenizer = Tokenizer.byte_level()
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save(tmp_path)
    loaded = Tokenizer.from_directory(tmp_path)
    text = "Grüße <|im_end|>"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.eos_token_ids == tokenizer.eos_token_ids
    assert loaded.chat_template == CHATML_TEMPLATE


def test_chat_template_renders_like_transformers(tmp_path: Path) -> None:
    Tokenizer.byte_level().save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(chat_template=CHATML_TEMPLATE, eos_token={"content": "<|im_end|>"})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 256}))
    tokenizer = Tokenizer.from_directory(tmp_path)
    assert tokenizer.has_chat_template
    assert tokenizer.eos_token_ids == {256, 258}
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_errors_surface() -> None:
    tokenizer = Tokenizer.byte_level()
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    tokenizer.chat_template = "{{ raise_exception('only user turns') }}"
    with pytest.raises(Exception, match="only user turns"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_missing_tokenizer_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        Tokenizer.from_directory(tmp_path)
