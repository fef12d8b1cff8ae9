"""The cluster port of a federated broker: the core's events go to the cluster (if any) and to
the federation node - local subscriptions become sources of event paths, local publications
events that follow them (seed 000 §3.7.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.adapters.federation.node import FederationNode
    from broker.core.ports import ClusterPort, Completion
    from broker.core.session import Message, SessionSnapshot


class FederatedClusterPort:
    """``inner`` (the cluster engine, or ``NullCluster``) plus ``federation``."""

    def __init__(self, inner: ClusterPort, federation: FederationNode) -> None:
        self.inner = inner
        self.federation = federation

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        self.inner.on_subscribe(client_id, topic_filter, share_group, qos)
        self.federation.on_subscribe(client_id, topic_filter, share_group)

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        self.inner.on_unsubscribe(client_id, topic_filter, share_group)
        self.federation.on_unsubscribe(client_id, topic_filter, share_group)

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        wait = self.inner.on_publish(message, from_client_id)
        self.federation.on_publish(message)
        return wait

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        return self.inner.before_attach(client_id, clean_start, username)

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return self.inner.owns_share_group(group, topic_filter)

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        return self.inner.subscriptions_ready(topic_filters, client_id)

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        self.inner.on_client_connected(client_id, session_present)

    def on_client_disconnected(self, client_id: str) -> None:
        self.inner.on_client_disconnected(client_id)
