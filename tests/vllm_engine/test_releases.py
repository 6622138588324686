"""The connector under each vLLM release it supports: 0.32 (installed, as the real-engine
tests run it), 0.33 and 0.34 (their CUDA wheels' Python, unpacked by scripts/test_vllm.sh:
no CPU build of them exists, and their model runners need CUDA's compiled ops, but their
schedulers, connector API and distributed state import and run here). In each,
``release_connector.py`` drives the connector's scheduler side inside the release's real
``Scheduler``: a prefill request finishes with NixlConnector's request protocol of that
release, a decode request copied from it waits for its KV and runs once the worker reports it
read; then the connector's worker side, a prefill and a decode worker, moves that request's
blocks through NIXL. The oracle: the releases' own key sets (NixlConnector's
``request_finished``, versions 14 to 16), the prompt's length and blocks, the base class's
own hooks and signatures, and the caches' bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
RELEASES = ["0.32.0", "0.33.0", "0.34.0"]
#: What NixlConnector's ``request_finished`` returns in vLLM 0.32 (its protocol 14); 0.33's
#: (15) and 0.34's (16) add the registration generation.
NIXL_V14_KEYS = {"do_remote_prefill", "do_remote_decode", "remote_block_ids",
                 "remote_engine_id", "remote_request_id", "remote_host", "remote_port",
                 "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
                 "remote_blocks_expiry_time", "transfer_mode"}  # fmt: skip
NIXL_V15_KEYS = NIXL_V14_KEYS | {"remote_registration_generation"}
PROMPT_TOKENS, BLOCK = 70, 32


def overlay(release: str) -> str:
    """The PYTHONPATH that runs ``release``: none for the installed one."""
    if release == "0.32.0":
        return ""
    root = os.environ.get("PDPLAN_VLLM_RELEASES")
    assert root, "scripts/test_vllm.sh sets PDPLAN_VLLM_RELEASES to the unpacked 0.33/0.34"
    folder = Path(root) / f"vllm-{release}"
    assert (folder / "vllm" / "__init__.py").is_file(), f"{folder} holds no vllm package"
    return str(folder)


@pytest.fixture(scope="module")
def seen(model: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for release in RELEASES:
        paths = [overlay(release), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        run = subprocess.run([sys.executable, str(HERE / "release_connector.py"), str(model)],
                             env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
        assert run.returncode == 0 and lines, run.stderr[-4000:]
        out[release] = json.loads(lines[-1].removeprefix("RESULT "))
    return out


@pytest.mark.parametrize("release", RELEASES)
def test_the_connector_loads_with_the_release_s_hooks(
    seen: dict[str, dict[str, Any]], release: str
) -> None:
    got = seen[release]
    assert got["version"] == release
    assert got["differing_signatures"] == {}  # every override takes the base's parameters
    # Sleep mode declined (vLLM refuses enable_sleep_mode at startup, naming the connector).
    assert got["supports_sleep_mode"] is False
    if release >= "0.33":
        assert {"unregister_kv_caches", "restore_kv_caches"} <= set(got["base_hooks"])
    if release >= "0.34":
        # The extensible cache gives a connector that registers memory one allocation a
        # layer: the connector says it registers.
        assert "kv_cache_access" in got["base_hooks"]
        assert got["registers_kv_cache_memory"] is True
    else:
        assert got["registers_kv_cache_memory"] is None


@pytest.mark.parametrize("release", RELEASES)
def test_a_request_crosses_the_release_s_scheduler_by_nixl_s_protocol(
    seen: dict[str, dict[str, Any]], release: str
) -> None:
    got = seen[release]
    params = got["prefill_params"]
    # Every key NixlConnector of any supported release returns, so any release's proxy or
    # router finds what it reads.
    assert NIXL_V15_KEYS <= set(params), NIXL_V15_KEYS - set(params)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_num_tokens"] == PROMPT_TOKENS
    assert [len(g) for g in params["remote_block_ids"]] == [-(-PROMPT_TOKENS // BLOCK)]
    # The newest registration any worker told (one registered twice: a weight reload).
    assert params["remote_registration_generation"] == 2
    assert params["transfer_mode"] == "pull"
    assert got["prefill_blocks_held"] is True  # held for the decode side
    # A worker's step output after a reload carries its new generation to the scheduler.
    assert got["generation_after_reload"] == [3]
    assert got["decode_waiting"].endswith("WAITING_FOR_REMOTE_KVS")
    [receive] = got["decode_receives"]
    name, local, remote, remote_request, port, generation = receive
    assert (name, remote_request, port, generation) == ("d-1", "p-1", 5990, 2)
    assert remote == params["remote_block_ids"] and [len(g) for g in local] == [3]
    # Once read, the decode request runs from the prompt's end: one token scheduled.
    assert got["decode_computed"] == PROMPT_TOKENS
    assert got["decode_scheduled"] == {"d-1": 1}


def local_blocks(got: dict[str, Any]) -> list[int]:
    [receive] = got["decode_receives"]
    return [b for group in receive[1] for b in group]


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_s_workers_move_the_request_exactly(
    seen: dict[str, dict[str, Any]], release: str
) -> None:
    """The worker side under the release's distributed state: the decode worker reads the
    scheduler's request through NIXL from the prefill worker, in caches shaped as vLLM's CPU
    backend shapes them (random prefill pages, a zeroed decode cache)."""
    got = seen[release]["worker"]
    assert got["received"] == ["d-1"]
    assert got["exact"] is True  # its blocks equal the prefill side's, byte for byte
    assert got["untouched"] is True  # and no other block was written
    blocks = -(-PROMPT_TOKENS // BLOCK)
    # Blocks x layers x (block size x KV heads x 2 x head size) float32s.
    assert got["bytes_read"] == blocks * 2 * BLOCK * 2 * 2 * 64 * 4
    assert got["load_errors"] == []
    # A weight reload: registered again, told to the scheduler once, said in handshakes.
    assert got["told_after_reload"] == [2, None]
    assert got["handshake_generation"] == 2
    # A request of the new generation is read, byte for byte, from the reloaded pages.
    assert (got["d-2_received"], got["d-2_load_errors"], got["d-2_exact"]) == (["d-2"], [], True)
    # One of the old generation (written before the reload) is recomputed, never read.
    assert got["d-3_received"] == ["d-3"]
    assert got["d-3_load_errors"] == sorted(local_blocks(seen[release]))
    assert got["older_left_zero"] is True
