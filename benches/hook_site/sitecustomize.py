"""Times the KV connectors in every process vLLM starts for benches/vllm_load.py (this folder
is on their PYTHONPATH only there): see benches/serve_timed.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import serve_timed

serve_timed.watch()
