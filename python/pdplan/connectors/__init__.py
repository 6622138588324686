"""pdplan inside serving engines: each runtime's adapter over the transfer session
(``pdplan.session``). ``pdplan.connectors.vllm.PdplanConnector`` is vLLM's
(``kv_connector_module_path``). An adapter module imports its engine; this package imports
nothing."""
