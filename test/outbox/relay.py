"""relay.py URL NAME: a relay of topic "pyhooks" (clients/python relay() +
webhook()) delivering to URL; stops gracefully on SIGTERM and prints its
counts as JSON."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from pg_idempotency.relay import RelayOptions, relay, webhook  # noqa: E402

print(f"{sys.argv[2]} started", flush=True)
r = relay("pyhooks", webhook(sys.argv[1], timeout_seconds=5),
          RelayOptions(conninfo="dbname=shop", batch_size=4, concurrency=4, visibility_seconds=2,
                       poll_interval_seconds=0.5, retry_delay_seconds=0.2))
print(f"{sys.argv[2]} stopped {json.dumps(r.counts)}", flush=True)
