"""rocrate-validator, offline: the JSON-LD context it fetches (RO-Crate's, from w3id.org) is
served from the copy the `rocrate` library ships, so CI needs no network.  Any other URL
still goes out (and fails without a network: the check then says which).

    python -m tests.rocrate_offline validate -p process-run-crate-0.5 --output-format json DIR
"""

from __future__ import annotations

import io
import sys
import urllib.request
from pathlib import Path

import requests
import rocrate

DATA = Path(rocrate.__file__).parent / "data"
LOCAL = {f"https://w3id.org/ro/crate/{v}/context": DATA / "ro-crate.jsonld"
         for v in ("1.1", "1.2", "1.3")}


class _Response(io.BytesIO):
    def __init__(self, data: bytes, url: str) -> None:
        super().__init__(data)
        self.url, self.status = url, 200
        self.headers = {"Content-Type": "application/ld+json"}

    def geturl(self) -> str:
        return self.url

    def info(self) -> dict:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


_urlopen = urllib.request.urlopen


def _local_urlopen(req, *args, **kwargs):
    url = getattr(req, "full_url", req)
    if url in LOCAL:
        return _Response(LOCAL[url].read_bytes(), url)
    return _urlopen(req, *args, **kwargs)


_request = requests.sessions.Session.request


def _local_request(self, method, url, *args, **kwargs):
    if url in LOCAL:
        r = requests.models.Response()
        r.status_code, r.url, r._content = 200, url, LOCAL[url].read_bytes()
        r.headers["Content-Type"] = "application/ld+json"
        return r
    return _request(self, method, url, *args, **kwargs)


def main() -> None:
    urllib.request.urlopen = _local_urlopen
    requests.sessions.Session.request = _local_request
    from rocrate_validator.cli.main import cli

    sys.argv = ["rocrate-validator", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
