"""The connector's settings, read from ``kv_transfer_config.kv_connector_extra_config``: every
key optional, unknown keys refused (a misspelt key must not silently fall back)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from pdplan._bounded import shown
from pdplan._staging import CostModel
from pdplan.session._faults import SettingsFault

_DEFAULTS = CostModel()
#: The longest lease or timeout taken (a day): a hold states a lease in milliseconds.
MAX_SECONDS = 86_400.0


@dataclass(frozen=True)
class Settings:
    """``kv_connector_extra_config``'s keys."""

    engine: str = "nixl"
    """The transfer engine: ``"nixl"`` (UCX) or ``"mooncake"`` (its TCP transport)."""
    side_channel_host: str = "127.0.0.1"
    """Where the prefill instance's side channel listens, and what it tells decode."""
    side_channel_port: int = 5700
    """The prefill instance's first side-channel port: TP rank ``r`` listens on
    ``side_channel_port + r``. Give each prefill instance on a host its own range."""
    kv_lease_seconds: float = 120.0
    """How long a prefill rank keeps a request's blocks for a decode side that never reads
    them; then it frees them."""
    handshake_timeout_seconds: float = 5.0
    """How long a decode rank waits for a prefill rank's side channel to answer."""
    transfer_timeout_seconds: float = 60.0
    """How long a decode rank waits for one request's reads before reporting its blocks
    lost (vLLM then recomputes or fails them, by ``kv_load_failure_policy``)."""
    nixl_progress_delay_us: int = 10
    """Microseconds NIXL's progress thread sleeps between polls. NIXL's Python agent polls
    without pause (a core busy per agent, idle or not); 0 keeps that."""
    descriptors: str = "auto"
    """How a decode rank hands its reads to the engine: ``"strided"`` (NIXL 1.5's N x 5
    lists, ``strided_descriptors``), ``"flat"`` (``(src, dst, length)`` descriptors), or
    ``"auto"``: strided where the engine takes them (NIXL), flat elsewhere (Mooncake). Strided
    reads are made where the cost model says rows take less time than flat descriptors."""
    per_descriptor_us: float = _DEFAULTS.per_descriptor_s * 1e6
    """The engine's cost a flat descriptor, in µs (``calibrate_posting`` measures it)."""
    per_row_us: float = _DEFAULTS.per_row_s * 1e6
    """The engine's cost a strided row, in µs."""
    per_block_us: float = _DEFAULTS.per_block_s * 1e6
    """The engine's cost a block of a strided row, in µs."""

    def cost_model(self) -> CostModel:
        """The cost model reads are weighed by: the defaults with these posting costs."""
        return replace(
            _DEFAULTS,
            per_descriptor_s=self.per_descriptor_us * 1e-6,
            per_row_s=self.per_row_us * 1e-6,
            per_block_s=self.per_block_us * 1e-6,
        )

    @classmethod
    def of(cls, extra: Mapping[str, Any] | None) -> Settings:
        if extra is not None and not isinstance(extra, Mapping):
            raise SettingsFault(
                f"kv_connector_extra_config must be a mapping, got {type(extra).__name__}"
            )
        given = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise SettingsFault(
                f"kv_connector_extra_config has keys PdplanConnector does not read: {unknown}; "
                f"known: {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for name, value in given.items():
            kind = type(getattr(cls, name))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise SettingsFault(
                    f"kv_connector_extra_config {name}={shown(value)} must be a {kind.__name__}"
                )
            values[name] = value
        settings = cls(**values)
        if not 0 < settings.side_channel_port < 65536:
            raise SettingsFault(f"side_channel_port={settings.side_channel_port} is not a TCP port")
        for name in ("kv_lease_seconds", "handshake_timeout_seconds", "transfer_timeout_seconds"):
            if not 0 < getattr(settings, name) <= MAX_SECONDS:
                raise SettingsFault(f"{name} must be positive, at most {MAX_SECONDS} (a day)")
        if settings.descriptors not in ("auto", "strided", "flat"):
            raise SettingsFault(
                f"descriptors={shown(settings.descriptors)} must be 'auto', 'strided' or 'flat'"
            )
        if settings.descriptors == "strided" and settings.engine == "mooncake":
            raise SettingsFault(
                "descriptors='strided' needs NIXL: Mooncake reads flat descriptors (use 'auto')"
            )
        if not 0 <= settings.nixl_progress_delay_us <= 1_000_000:
            raise SettingsFault(
                f"nixl_progress_delay_us={settings.nixl_progress_delay_us} must be 0 to "
                "1,000,000 (a second)"
            )
        settings.cost_model()  # posting costs that make no estimate are refused here
        return settings
