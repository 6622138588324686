"""Two DP ranks of one prefill server against a TP 2 decode server, through PdplanConnector and
through vLLM's own NixlConnector: the serving guide's commands (its `prefill-dp`, `decode` and
`proxy-dp` blocks, the second connector's config put in place of the first's), prompts through
the proxy at once, each against the prefill server decoding it alone, and how many prompt
tokens the decode server took from the connector (vLLM's `prompt_tokens_by_source`). Needs vLLM
(scripts/install_vllm.sh).

    python benches/vllm_dp.py   # writes benches/results/vllm_dp.md
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

from harness import prompts_of  # noqa: E402
from test_serving import complete, guide_command, wait_healthy  # noqa: E402

from provenance import write  # noqa: E402

#: NixlConnector's config for the guide's servers, and the side-channel port of each.
NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
NIXL_PORTS = {"prefill-dp": 5800, "decode": 5610}


def command(name: str, connector: str) -> str:
    """The guide's command ``name``, with NixlConnector's config where ``connector`` says."""
    text = guide_command(name)
    if connector == "nixl" and name in NIXL_PORTS:
        text = re.sub(r"--kv-transfer-config '[^']*'", f"--kv-transfer-config '{NIXL}'", text)
        text = f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_PORTS[name]} {text}"
    return text


def loaded(url: str) -> int:
    """The prompt tokens a server took from its connector, not computing them."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"'
                       r"[^}]*\} ([0-9.e+]+)", text)  # fmt: skip
    return int(sum(float(n) for n in found))


def served(connector: str, work: Path) -> dict[str, Any]:
    """One connector's run: prompts equal to the prefill server's own, of how many; tokens."""
    model = work / "model"
    env = {**os.environ, "MODEL": str(model)}
    subprocess.run(["bash", "-c", guide_command("model")], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    try:
        for name, url in (("prefill-dp", "http://127.0.0.1:8300"),
                          ("decode", "http://127.0.0.1:8200"), ("proxy-dp", None)):  # fmt: skip
            logs.append(open(work / f"{connector}-{name}.log", "wb"))
            processes.append(
                subprocess.Popen(
                    ["bash", "-c", command(name, connector)],
                    cwd=ROOT,
                    env=env,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                )
            )
            if url:
                wait_healthy(url, processes[-1], 600)
        deadline = time.monotonic() + 60
        while b"proxy listening" not in (work / f"{connector}-proxy-dp.log").read_bytes():
            assert processes[-1].poll() is None and time.monotonic() < deadline, "no proxy"
            time.sleep(0.2)
        batch = prompts_of(tuple(range(9, 121, 11)), salt=6)
        with ThreadPoolExecutor(len(batch)) as pool:
            alone = list(pool.map(lambda p: complete(8300, model, p), batch))
        with ThreadPoolExecutor(len(batch)) as pool:  # at once: the DP ranks share them
            through = list(pool.map(lambda p: complete(8001, model, p), batch))
        return {"equal": sum(a == b for a, b in zip(through, alone)), "prompts": len(batch),
                "tokens": sum(len(p) for p in batch),
                "loaded": loaded("http://127.0.0.1:8200")}  # fmt: skip
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()


def main() -> None:
    rows = []
    for connector, shown in (("pdplan", "PdplanConnector"), ("nixl", "NixlConnector")):
        work = Path(f"/tmp/pdplan-vllm-dp/{connector}")
        work.mkdir(parents=True, exist_ok=True)
        done = served(connector, work)
        print(connector, done, flush=True)
        rows.append(f"| {shown} | {done['equal']}/{done['prompts']} | "
                    f"{done['loaded']} of {done['tokens']} |")  # fmt: skip
    write("vllm_dp.md", "\n".join([
        "The serving guide's prefill server of two DP ranks (TP 1 each) against its decode "
        "server (TP 2), through its proxy, the prompts sent at once: how many decode as the "
        "prefill server decodes them alone, and the prompt tokens the decode server took from "
        "the connector; vLLM 0.32's CPU backend, NIXL 1.5.1 (UCX, loopback), the guide's tiny "
        "Llama.",
        "",
        "| connector | prompts equal | prompt tokens loaded |",
        "| --- | --- | --- |",
        *rows,
    ]))  # fmt: skip


if __name__ == "__main__":
    main()
