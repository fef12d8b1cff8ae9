"""The image keeps Debian's license files: every Debian package installed in it has its
``/usr/share/doc/<package>/copyright`` (the license terms the redistributed binaries require;
scripts/build_image.sh trims the base's documentation but keeps these, as Debian's slim images
do). One short container run (``--entrypoint python``, no network)."""

from __future__ import annotations

import json

import pytest

from tests.process.image.chart_pods import podman

pytestmark = pytest.mark.image

CHECK = r"""
import json, os
packages, current, installed = [], None, False
with open("/var/lib/dpkg/status") as status:
    for line in status.read().splitlines() + [""]:
        if line.startswith("Package: "):
            current = line.split(": ", 1)[1]
        elif line.startswith("Status: "):
            installed = line.endswith(" installed")
        elif not line and current:
            if installed:
                packages.append(current)
            current, installed = None, False
missing = [p for p in packages if not os.path.isfile(f"/usr/share/doc/{p}/copyright")]
print(json.dumps({"packages": len(packages), "missing": missing}))
"""


def test_every_debian_package_keeps_its_copyright_file(image: str) -> None:
    done = podman(
        "run", "--rm", "--no-healthcheck", "--network", "none", "--entrypoint", "python", image, "-c", CHECK,
        timeout_s=60,
    )  # fmt: skip
    found = json.loads(done.stdout)
    assert found["packages"] >= 20, found  # dpkg's status lists the image's packages
    assert found["missing"] == [], (
        f"{len(found['missing'])} of {found['packages']} without copyright: {found}"
    )
