"""The web console in a real browser (Debian's chromium, driven by playwright; never a downloaded
browser) against the shared live 3-broker cluster: sign in, click through every view, disconnect
a client connected to another broker, publish a message and see a subscriber on a third broker
get it. A screenshot of each view is taken; ``SKIPMQ_TEST_SCREENSHOTS=1`` writes them to
docs/figures/console-*.png (shown in docs/operations.md)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.admin.conftest import ADMIN, AdminCluster
from tests.support.cluster import ClusterClient
from tests.support.paths import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 15_000

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (scripts/setup.sh)"
)


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1180, "height": 720})
            context.set_default_timeout(TIMEOUT_MS)
            yield context.new_page()
        finally:
            browser.close()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 5000  # something was drawn
    if os.environ.get("SKIPMQ_TEST_SCREENSHOTS"):
        shutil.copy(path, REPO_ROOT / "docs" / "figures" / path.name)


def test_console_views_kick_and_publish(admin_cluster: AdminCluster, page: Any, tmp_path: Path) -> None:
    admin = admin_cluster
    brokers = admin.cluster.brokers
    tag = uuid.uuid4().hex[:6]
    victim = ClusterClient(brokers[2].mqtt_port, client_id=f"console-{tag}-victim")
    listener = ClusterClient(brokers[1].mqtt_port, client_id=f"console-{tag}-listener")
    try:
        victim.subscribe(f"console-{tag}/alarms/#", 1)
        listener.subscribe(f"console-{tag}/cmd/#", 1)
        # a message from broker 0 on the victim's class, so the overlay view has a route to draw
        admin.call(0, "POST", "/admin/v1/publish", json={"topic": f"console-{tag}/alarms/x", "payload": "t"})
        victim.wait_message(10)
        page.goto(admin.url(0, "/console/"))
        page.fill("input[name=user]", ADMIN[0])
        page.fill("input[name=password]", "wrong")
        page.click("form#login button")
        page.wait_for_selector("#login-error:has-text('401')")
        page.fill("input[name=password]", ADMIN[1])
        page.click("form#login button")
        page.wait_for_selector("#who:has-text('root (admin)')")

        # cluster: one card per broker, each with its links up
        page.locator(".card.broker").nth(2).wait_for()  # (the console's CSP forbids eval'd predicates)
        assert page.locator(".card.broker").count() == 3
        for broker in brokers:
            assert broker.node_id in page.inner_text(f".card.broker[data-node='{broker.node_id}']")
        _shot(page, tmp_path, "cluster")

        # overlay: the Skip Graph's levels and the selected class's route
        page.click("nav button[data-view=overlay]")
        page.wait_for_selector("svg#skipgraph circle")
        page.select_option("#cls", f"=console-{tag}")
        page.wait_for_selector(f"#route-summary:has-text('{brokers[0].node_id} → one hop')")
        assert page.locator("svg#skipgraph path.route").count() >= 1
        assert page.locator("svg#skipgraph text").count() >= 2  # at least levels 0 and 1
        _shot(page, tmp_path, "overlay")

        # topics: who can get console-<tag>/#
        page.click("nav button[data-view=topics]")
        page.fill("#tfilter", f"console-{tag}/#")
        page.press("#tfilter", "Enter")
        page.wait_for_selector(f"td:has-text('console-{tag}-victim')")
        _shot(page, tmp_path, "topics")

        # users and ACL
        page.click("nav button[data-view=users]")
        page.wait_for_selector("h2:has-text('ACL')")
        _shot(page, tmp_path, "users")

        # clients: disconnect the one on broker 2 from broker 0's console
        page.click("nav button[data-view=clients]")
        page.fill("#prefix", f"console-{tag}")
        page.press("#prefix", "Enter")
        button = page.locator(f"button.kick[data-client='console-{tag}-victim']")
        button.wait_for()
        _shot(page, tmp_path, "clients")
        button.click()
        reason = victim.wait_disconnected(10)
        assert getattr(reason, "value", reason) == 0x98

        # publish from the console (broker 0): the subscriber on broker 1 gets it
        page.click("nav button[data-view=publish]")
        page.fill("input[name=topic]", f"console-{tag}/cmd/valve")
        page.fill("input[name=payload]", "open")
        page.click("#pubform button")
        page.wait_for_selector("#pubresult:has-text('Published 4 bytes')")
        message = listener.wait_message(10)
        assert (message.topic, message.payload) == (f"console-{tag}/cmd/valve", b"open")
        _shot(page, tmp_path, "publish")
    finally:
        victim.close()
        listener.close()
