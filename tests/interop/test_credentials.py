"""S3 credentials as clusters give them: a web identity token (`AWS_WEB_IDENTITY_TOKEN_FILE` and
`AWS_ROLE_ARN`, as EKS sets them for a service account) exchanged at STS for the credentials a
mount signs with. object_store talks to STS over HTTPS only, so the STS here is a small one of this
test's on TLS, its certificate from a CA made for the run and trusted through `SSL_CERT_FILE`
(`AWS_ENDPOINT_URL_STS` names it); it records what it is asked and answers as STS does. The bucket
is moto's. The daemon runs with a bare environment: no keys, no profile, instance metadata
disabled, so the only credentials it can sign with are those STS gives: with STS answering, the
mount reads the array and STS was asked with the token file's token and the role; with STS
refusing, the mount is refused in one line and nothing is mounted.

Run: target/venv/bin/python -m pytest tests/interop/test_credentials.py
"""

import contextlib
import http.server
import os
import ssl
import subprocess
import threading
import urllib.parse
from pathlib import Path

import boto3
import numpy as np
import pytest
import zarr
from zarr.storage import ObjectStore

from object_stores import BUCKET, s3_objects

ROLE = "arn:aws:iam::123456789012:role/zarr-writer"
ANSWER = """<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>ASIAWEBIDENTITY</AccessKeyId>
      <SecretAccessKey>from-sts</SecretAccessKey>
      <SessionToken>session-from-sts</SessionToken>
      <Expiration>2099-01-01T00:00:00Z</Expiration>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>"""
REFUSAL = """<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>
<Message>the token is not valid</Message></Error></ErrorResponse>"""


def certificates(work):
    """A CA made for this run and a certificate it signed for 127.0.0.1: (ca.pem, cert, key)."""
    run = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=work)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=shardfs test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "sts.key", "-out", "sts.csr", "-subj", "/CN=127.0.0.1")
    (work / "ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "sts.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "sts.pem",
        "-days", "2", "-extfile", "ext")
    return work / "ca.pem", work / "sts.pem", work / "sts.key"


class Sts:
    """An STS endpoint on TLS that answers AssumeRoleWithWebIdentity (or refuses it, when
    `refusing`), keeping each request's parameters in `asked`."""

    def __init__(self, cert, key):
        self.asked, self.refusing = [], False
        sts = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                length = int(self.headers.get("Content-Length") or 0)
                query.update(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                sts.asked.append(query)
                status, body = (400, REFUSAL) if sts.refusing else (200, ANSWER)
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sts(tmp_path_factory):
    work = tmp_path_factory.mktemp("sts")
    ca, cert, key = certificates(work)
    server = Sts(cert, key)
    server.ca = ca
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def array(s3_server):
    """The array `a` in moto's bucket below `web-identity`, and what it holds."""
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=BUCKET)
    data = np.random.default_rng(4).integers(0, 60000, (32, 32), dtype="uint16")
    zarr.create_array(store=ObjectStore(s3_objects(s3_server.endpoint, "web-identity")), name="a", shape=data.shape,
                      chunks=(8, 8), shards=(16, 16), dtype="uint16", fill_value=0)[...] = data
    return data


def cluster_environment(tmp_path, sts):
    """A pod's environment as EKS makes it for a service account: a token file and a role, and
    nothing else that holds credentials."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.a-service-account-token.sig")
    home = tmp_path / "home"
    home.mkdir()
    return {"PATH": os.environ["PATH"], "HOME": str(home), "AWS_REGION": "us-east-1",
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_ROLE_ARN": ROLE, "AWS_ROLE_SESSION_NAME": "worker-0",
            "AWS_ENDPOINT_URL_STS": sts.url, "SSL_CERT_FILE": str(sts.ca), "AWS_EC2_METADATA_DISABLED": "true"}


def test_a_web_identity_token_is_exchanged_at_sts_for_the_mounts_credentials(s3_server, sts, array, tmp_path):
    env = cluster_environment(tmp_path, sts)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sts.refusing, sts.asked[:] = False, []
    started = subprocess.run(["shardfs", "mount", f"s3://{BUCKET}/web-identity", mnt, "--read-only",
                              "--endpoint-url", s3_server.endpoint], env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    try:
        assert np.array_equal(zarr.open_array(mnt / "a", mode="r")[...], array)
    finally:
        if subprocess.run(["shardfs", "unmount", mnt], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    assert sts.asked, "STS was never asked"
    asked = sts.asked[0]
    assert asked["Action"] == "AssumeRoleWithWebIdentity"
    assert asked["RoleArn"] == ROLE and asked["RoleSessionName"] == "worker-0"
    assert asked["WebIdentityToken"] == Path(env["AWS_WEB_IDENTITY_TOKEN_FILE"]).read_text()


def test_a_token_sts_refuses_refuses_the_mount_in_one_line(s3_server, sts, array, tmp_path):
    env = cluster_environment(tmp_path, sts)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sts.refusing, sts.asked[:] = True, []
    try:
        started = subprocess.run(["shardfs", "mount", f"s3://{BUCKET}/web-identity", mnt, "--read-only",
                                  "--endpoint-url", s3_server.endpoint], env=env, capture_output=True, text=True,
                                 timeout=120)
    finally:
        sts.refusing = False
    assert started.returncode != 0
    assert started.stderr.count("\n") == 1 and f"s3://{BUCKET}/web-identity" in started.stderr, started.stderr
    assert sts.asked, "STS was never asked"
    assert not os.path.ismount(mnt)
