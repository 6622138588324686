"""The "Serving with vLLM" guide, run as written: its prefill server, decode server (TP 2)
and proxy commands started as processes with ``MODEL`` set to the tiny model, then requests
through the proxy's OpenAI API. The oracle: the tokens one vLLM instance alone decodes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from harness import LENGTHS, MAX_TOKENS, prompts_of

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs/guides/serving-vllm.md"


def guide_command(name: str) -> str:
    """The bash block after ``<!-- serve:NAME -->`` in the guide, continuation lines joined."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(rf"<!-- serve:{name} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"the guide has no serve:{name} block"
    return found.group(1).replace("\\\n", " ").strip()


def wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url} exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {seconds} s")


def test_the_guide_s_servers_and_proxy_decode_what_one_instance_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]]
) -> None:
    env = {**os.environ, "MODEL": str(model)}
    processes: list[subprocess.Popen[bytes]] = []
    files = []

    def start(name: str) -> subprocess.Popen[bytes]:
        files.append(open(logs / f"serve-{name}.log", "wb"))
        command = ["bash", "-c", guide_command(name)]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=files[-1],
                                   stderr=subprocess.STDOUT)  # fmt: skip
        processes.append(process)
        return process

    try:
        wait_healthy("http://127.0.0.1:8100", start("prefill"))
        wait_healthy("http://127.0.0.1:8200", start("decode"))
        start("proxy")
        time.sleep(2)
        client = subprocess.run(["bash", "-c", guide_command("client")], cwd=ROOT, env=env,
                                capture_output=True, check=True, timeout=300)  # fmt: skip
        assert json.loads(client.stdout)["choices"][0]["token_ids"]
        for prompt in prompts_of(LENGTHS):
            body = {"model": str(model), "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
            request = urllib.request.Request("http://127.0.0.1:8000/v1/completions",
                                             json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as response:
                answer = json.loads(response.read())
            assert answer["choices"][0]["token_ids"] == reference[tuple(prompt)]
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for file in files:
            file.close()
