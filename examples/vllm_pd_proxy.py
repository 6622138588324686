"""A minimal prefill/decode proxy for two vLLM servers with PdplanConnector (or vLLM's
NixlConnector: the protocol is the same). It speaks the OpenAI completions API: each request
goes to the prefill server with ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode":
true}``, then to the decode server with the ``kv_transfer_params`` the prefill server returned,
and the decode server's answer goes back to the client. Standard library only.

    python examples/vllm_pd_proxy.py --port 8000 --prefill http://127.0.0.1:8100 \
        --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The longest request body the proxy reads.
MAX_BODY_BYTES = 16 << 20


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def make_handler(prefill: str, decode: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self.send_error(404, "the proxy serves /v1/completions and /v1/chat/completions")
                return
            length = int(self.headers.get("Content-Length", "0"))
            if not 0 < length <= MAX_BODY_BYTES:
                self.send_error(413, "request body missing or too large")
                return
            body = json.loads(self.rfile.read(length))
            first = {**body, "max_tokens": 1, "stream": False,
                     "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
            first.pop("max_completion_tokens", None)
            try:
                prefilled = post(prefill + self.path, first)
                params = prefilled.get("kv_transfer_params")
                answer = post(decode + self.path, {**body, "kv_transfer_params": params})
            except urllib.error.HTTPError as error:
                self.send_error(error.code, error.read().decode(errors="replace")[:500])
                return
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", required=True, help="the prefill server's URL")
    parser.add_argument("--decode", required=True, help="the decode server's URL")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.prefill, args.decode))
    host, port = server.server_address[:2]
    print(
        f"proxy listening on http://{host}:{port} (prefill {args.prefill}, decode {args.decode})",
        flush=True,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
