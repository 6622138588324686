"""pdplan as a vLLM KV connector: prefill and decode instances move each request's KV by
pdplan's plans, with vLLM's NixlConnector request protocol (a proxy or router that drives
NixlConnector drives this one unchanged).

Load it with ``kv_transfer_config={"kv_connector": "PdplanConnector",
"kv_connector_module_path": "pdplan.connectors.vllm", "kv_role": "kv_producer" |
"kv_consumer" | "kv_both", "kv_connector_extra_config": {...}}``; the extra keys are
``Settings``'s. A vLLM outside ``SUPPORTED_VLLM`` is refused at import, naming the range."""

from __future__ import annotations

from pdplan._core import UnsupportedPDLayoutError
from pdplan.session._settings import Settings

#: The vLLM releases the connector is tested against: ``>= low, < high``.
SUPPORTED_VLLM = ((0, 32), (0, 35))


def _check_vllm() -> None:
    try:
        import vllm
    except ImportError:
        raise UnsupportedPDLayoutError(
            "pdplan.connectors.vllm needs vLLM 0.32 to 0.34 (pip install 'pdplan[vllm]')"
        ) from None
    version = str(getattr(vllm, "__version__", "0"))
    try:
        release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        release = (0, 0)
    low, high = SUPPORTED_VLLM
    if not low <= release < high:
        raise UnsupportedPDLayoutError(
            f"PdplanConnector supports vLLM >= {low[0]}.{low[1]}, < {high[0]}.{high[1]}; "
            f"this is vLLM {version}"
        )


_check_vllm()

from pdplan.connectors.vllm._connector import PdplanConnector  # noqa: E402

__all__ = ["SUPPORTED_VLLM", "PdplanConnector", "Settings"]
