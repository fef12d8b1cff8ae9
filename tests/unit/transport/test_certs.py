"""``skipmq certs`` and the start-up check of a broker's cluster identity (broker/certs.py).

* CA rotation as documented: two CAs made by ``skipmq certs init`` have different names and their
  certificates carry key identifiers, so ``openssl verify`` with the bundle [old, new] verifies the
  certificates of both (before, only those of the first CA: "certificate signature failure");
* ``--days`` below 1 is refused with a clear error;
* a broker process whose key is not its certificate's, or whose certificate does not name its own
  peer id, or is not from a CA of the bundle, exits 2 naming the key, before it serves anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from broker.__main__ import run
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.certs import main as certs_main

HOST = "127.0.0.1"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_a_bundle_of_the_old_and_the_new_ca_verifies_certificates_of_both(tmp_path: Path) -> None:
    assert certs_main(["init", str(tmp_path / "old")]) == 0
    assert certs_main(["init", str(tmp_path / "new")]) == 0
    names = {
        x509.load_pem_x509_certificate((tmp_path / d / "ca.pem").read_bytes()).subject for d in ("old", "new")
    }
    assert len(names) == 2, "two CAs share one name"
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(
        (tmp_path / "old" / "ca.pem").read_bytes() + (tmp_path / "new" / "ca.pem").read_bytes()
    )
    for ca in ("old", "new"):
        assert certs_main(["issue", str(tmp_path / ca), f"{HOST}:7883", "--name", f"b-{ca}"]) == 0
        for ca_file in (bundle, tmp_path / ca / "ca.pem"):
            result = subprocess.run(
                ["openssl", "verify", "-CAfile", str(ca_file), str(tmp_path / ca / f"b-{ca}.pem")],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert result.returncode == 0 and ": OK" in result.stdout, (
                ca,
                ca_file,
                result.stdout,
                result.stderr,
            )
    other = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "new" / "ca.pem"),
            str(tmp_path / "old" / "b-old.pem"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.returncode != 0  # the new CA alone does not verify the old one's certificate


def test_a_validity_below_one_day_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert certs_main(["init", str(tmp_path)]) == 0
    for days in ("0", "-3"):
        with pytest.raises(SystemExit) as exit_info:
            certs_main(["issue", str(tmp_path), f"{HOST}:7883", "--days", days])
        assert exit_info.value.code == 2
        assert "at least 1 day" in capsys.readouterr().err
    assert not (tmp_path / f"{HOST}_7883.pem").exists()  # nothing written
    with pytest.raises(ValueError, match="at least 1 day"):
        make_ca(tmp_path / "other", days=0)


def _start(
    tmp_path: Path, port: int, ca: Path, cert: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    status = run(
        [
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--cluster-port",
            str(port),
            "--advertise-host",
            HOST,
            "--set",
            f"cluster.tls_ca_file={ca}",
            "--set",
            f"cluster.tls_cert_file={cert}",
            "--set",
            f"cluster.tls_key_file={key}",
        ]
    )
    return status, capsys.readouterr().err


def test_a_broker_whose_files_do_not_make_its_identity_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_ca(tmp_path / "ca")
    make_ca(tmp_path / "foreign")
    ca = tmp_path / "ca" / "ca.pem"
    cert, key = issue_broker_cert(tmp_path / "ca", f"{HOST}:7883", name="b")
    _other_cert, other_key = issue_broker_cert(tmp_path / "ca", f"{HOST}:7884", name="c")
    foreign_cert, foreign_key = issue_broker_cert(tmp_path / "foreign", f"{HOST}:7883", name="f")
    # the key of another certificate: not a traceback, a configuration error naming the key
    status, err = _start(tmp_path, 7883, ca, cert, other_key, capsys)
    assert status == 2 and "cluster.tls_key_file" in err and "does not belong" in err, err
    assert "Traceback" not in err
    # a certificate for another peer id than the one this broker advertises
    status, err = _start(tmp_path, 7885, ca, cert, key, capsys)
    assert status == 2 and "cluster.tls_cert_file" in err and f"{HOST}:7885" in err, err
    # a certificate of a CA that is not in the bundle (the others would refuse it)
    status, err = _start(tmp_path, 7883, ca, foreign_cert, foreign_key, capsys)
    assert status == 2 and "cluster.tls_cert_file" in err and "not signed by a CA of the bundle" in err, err
    # not a key at all
    status, err = _start(tmp_path, 7883, ca, cert, ca, capsys)
    assert status == 2 and "cluster.tls_key_file" in err, err
