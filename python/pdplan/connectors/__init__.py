"""pdplan inside serving engines: connectors that move a request's KV by pdplan's plans.

``pdplan.connectors.vllm.PdplanConnector`` is vLLM's (``kv_connector_module_path``). The
connector modules import their engine; this package imports nothing."""
