"""The admin API's route table: method, path, handler and the least role that may call it
(``readonly`` reads; ``admin`` also changes things, and exports password hashes)."""

from __future__ import annotations

from broker.adapters.admin import reads, traces, writes
from broker.adapters.admin.responses import Route

V1 = "/admin/v1"

ROUTES: tuple[Route, ...] = (
    Route("GET", f"{V1}/whoami", reads.whoami),
    Route("GET", f"{V1}/brokers", reads.brokers),
    Route("GET", f"{V1}/listeners", reads.listeners),
    Route("GET", f"{V1}/clients", reads.clients),
    Route("GET", f"{V1}/clients/{{client_id}}", reads.client),
    Route("POST", f"{V1}/clients/{{client_id}}/disconnect", writes.kick, "admin"),
    Route("GET", f"{V1}/sessions", reads.sessions),
    Route("GET", f"{V1}/subscriptions", reads.subscriptions),
    Route("GET", f"{V1}/retained", reads.retained),
    Route("DELETE", f"{V1}/retained", writes.retained_delete, "admin"),
    Route("GET", f"{V1}/classes", reads.classes),
    Route("GET", f"{V1}/overlay", reads.overlay),
    Route("POST", f"{V1}/publish", writes.publish, "admin"),
    Route("GET", f"{V1}/users", reads.users),
    Route("GET", f"{V1}/export/users", reads.users_export, "admin"),
    Route("POST", f"{V1}/import/users", writes.users_import, "admin"),
    Route("PUT", f"{V1}/users/{{username}}", writes.user_put, "admin"),
    Route("DELETE", f"{V1}/users/{{username}}", writes.user_delete, "admin"),
    Route("GET", f"{V1}/acl", reads.acl),
    Route("GET", f"{V1}/export/acl", reads.acl_export),
    Route("POST", f"{V1}/import/acl", writes.acl_import, "admin"),
    Route("PUT", f"{V1}/acl/users/{{username}}", writes.acl_put, "admin"),
    Route("DELETE", f"{V1}/acl/users/{{username}}", writes.acl_delete, "admin"),
    Route("PUT", f"{V1}/acl/{{kind:anonymous|patterns}}", writes.acl_put, "admin"),
    Route("DELETE", f"{V1}/acl/{{kind:anonymous|patterns}}", writes.acl_delete, "admin"),
    Route("GET", f"{V1}/traces", traces.traces_list),
    Route("POST", f"{V1}/traces", traces.trace_start, "admin"),
    Route("GET", f"{V1}/traces/{{trace_id}}", traces.trace_get),
)
