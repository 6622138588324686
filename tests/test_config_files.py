"""``ModelShape.from_hf_config`` takes what a user has: a config file or a model's folder, named
as given in every refusal, read to a bound whatever the file is (a pipe included)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from pdplan import ModelShape, UnsupportedPDLayoutError, limits

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 3,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_size": 1024,
}


def test_a_model_folder_reads_its_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "okapi-1b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    from_folder = ModelShape.from_hf_config(folder)
    from_file = ModelShape.from_hf_config(folder / "config.json")
    assert from_folder == from_file
    # The config's own numbers: 3 layers of 4 KV heads of 1024 / 16 = 64 dims.
    assert from_folder.num_layers == 3
    assert {(layer.kv_heads, layer.head_dim) for layer in from_folder.model_layers} == {(4, 64)}


def test_a_folder_without_a_config_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "okapi-empty"
    folder.mkdir()
    with pytest.raises(UnsupportedPDLayoutError, match=r"okapi-empty is a folder without a "):
        ModelShape.from_hf_config(folder)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[1]", "must hold a JSON object"),
        ("{not json", "is not valid JSON"),
        (json.dumps({"architectures": ["LlamaForCausalLM"]}), "num_hidden_layers"),
    ],
)
def test_the_core_s_refusal_names_the_file_given(tmp_path: Path, content: str, says: str) -> None:
    config = tmp_path / "okapi-7.json"
    config.write_text(content)
    with pytest.raises(UnsupportedPDLayoutError) as refused:
        ModelShape.from_hf_config(config)
    message = str(refused.value)
    assert message.startswith(str(config)) and says in message, message
    assert not message.startswith("config.json")


def test_a_missing_file_and_a_non_utf8_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=r"okapi-absent\.json: no such file"):
        ModelShape.from_hf_config(tmp_path / "okapi-absent.json")
    latin = tmp_path / "okapi-latin.json"
    latin.write_bytes(b'{"architectures": ["\xe9"]}')
    with pytest.raises(UnsupportedPDLayoutError, match=r"okapi-latin\.json: .*UTF-8"):
        ModelShape.from_hf_config(latin)


def test_an_endless_pipe_is_read_to_the_bound_and_refused(tmp_path: Path) -> None:
    """A stream longer than any config (``--config <(yes)``) is refused after
    ``MAX_CONFIG_BYTES + 1`` bytes: never read whole, never a hang."""
    fifo = tmp_path / "okapi-pipe"
    os.mkfifo(fifo)
    written = [0]

    def feed() -> None:
        chunk = b" " * 65536
        try:
            with fifo.open("wb") as stream:
                while written[0] <= 4 * limits.MAX_CONFIG_BYTES:
                    stream.write(chunk)
                    written[0] += len(chunk)
        except BrokenPipeError:
            pass  # the reader stopped at its bound and closed the pipe

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_CONFIG_BYTES"):
        ModelShape.from_hf_config(fifo)
    writer.join(timeout=30)
    assert not writer.is_alive()
    assert written[0] < 4 * limits.MAX_CONFIG_BYTES  # the reader stopped early
