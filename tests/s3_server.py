"""moto's S3 server with atomic conditional writes, for the tests.

moto checks ``If-None-Match: *`` and then writes, without a lock, in a threaded
server: two racing create-if-absent PUTs can both "win". Real S3 and MinIO decide a
conditional write atomically, and ctp's safety rests on that (a state-log offset, an
epoch marker, a GC history seq each has exactly one winner). This runs moto's own WSGI
app behind one lock for every request that changes state (PUT, POST, DELETE), so the
server the tests race against keeps the promise the real ones keep. Reads stay
concurrent.

    python -m tests.s3_server -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})


class SerializedWrites:
    """WSGI middleware: one state-changing request at a time, reads in parallel."""

    def __init__(self, app: Any):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITE_METHODS:
            return self.app(environ, start_response)
        with self.lock:
            # Drain the response inside the lock: moto may do the work lazily.
            return list(self.app(environ, start_response))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, SerializedWrites(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
