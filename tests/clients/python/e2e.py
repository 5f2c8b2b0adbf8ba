"""The Python client generated from openapi.json (openapi-python-client), driven end to end
against a running `tidings serve` (embedded backend): infra/clients.sh generates the client into
tests/clients/python/generated and runs this with TIDINGS_URL and TIDINGS_API_KEY (a tenant key).

Every call goes through the generated functions and models; 409 and 422 come back as the
generated `Problem` model, and a status the document does not list raises
`errors.UnexpectedStatus` (the client is built with `raise_on_unexpected_status`), which fails
the run.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from http import HTTPStatus
from typing import NoReturn

from tidings_client import AuthenticatedClient
from tidings_client.api.notifications import (
    notifications_create,
    notifications_deliveries,
    notifications_show,
)
from tidings_client.api.templates import templates_put_template
from tidings_client.api.users import users_get_user, users_put_user
from tidings_client.models import (
    Accepted,
    Category,
    Channel,
    DeliveryPage,
    DeliveryStatus,
    LocaleContent,
    NotificationRequest,
    NotificationRequestParams,
    NotificationStatus,
    NotificationView,
    Problem,
    UserIds,
    Template,
    TemplateInput,
    TemplateInputLocales,
    User,
    UserInput,
)
from tidings_client.types import Unset


def fail(message: str) -> NoReturn:
    print(f"python client e2e: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(ok: bool, message: str) -> None:
    if not ok:
        fail(message)


def problem(parsed: object, status: HTTPStatus, code: str, field: str | None = None) -> Problem:
    """The answer is the generated Problem model with this status and code (and field)."""
    check(isinstance(parsed, Problem), f"expected a Problem for {status.value} {code}, got {parsed!r}")
    assert isinstance(parsed, Problem)  # for the type checker; check() has failed otherwise
    check(parsed.status == status.value, f"problem status {parsed.status}, expected {status.value}: {parsed!r}")
    check(parsed.code == code, f"problem code {parsed.code!r}, expected {code!r}: {parsed!r}")
    if field is not None:
        check(parsed.field == field, f"problem field {parsed.field!r}, expected {field!r}: {parsed!r}")
    return parsed


def main() -> None:
    base_url = os.environ["TIDINGS_URL"]
    key = os.environ["TIDINGS_API_KEY"]
    run = uuid.uuid4().hex[:10]
    client = AuthenticatedClient(base_url=base_url, token=key, raise_on_unexpected_status=True, timeout=30.0)

    with client:
        # Two users, so that the deliveries come in more than one page of one.
        users = [f"py-{run}-{i}" for i in range(2)]
        for i, user_id in enumerate(users):
            body = UserInput(email=f"{user_id}@example.com", locale="en", timezone="Europe/Paris", tags=["e2e"])
            user = users_put_user.sync(user_id, client=client, body=body)
            check(isinstance(user, User), f"PUT user answered {user!r}")
            assert isinstance(user, User)
            check(user.user_id == user_id and user.email == f"{user_id}@example.com", f"user as stored: {user!r}")
        read = users_get_user.sync(users[0], client=client)
        check(isinstance(read, User) and read.email == f"{users[0]}@example.com", f"GET user answered {read!r}")

        # 422 as a typed error: an address that is not one, naming the field.
        bad_user = users_put_user.sync_detailed(f"py-{run}-bad", client=client, body=UserInput(email="not an address"))
        check(bad_user.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, f"bad email: {bad_user.status_code}")
        problem(bad_user.parsed, HTTPStatus.UNPROCESSABLE_ENTITY, "invalid_field", "email")

        template_id = f"py-{run}-shipped"
        locales = TemplateInputLocales()
        locales["en"] = LocaleContent(
            email_subject="Order {{ order_id }} shipped",
            email_body="Hello, your order {{ order_id }} is on its way.",
        )
        template = templates_put_template.sync(
            template_id, client=client, body=TemplateInput(default_locale="en", locales=locales)
        )
        check(isinstance(template, Template), f"PUT template answered {template!r}")

        # 422 as a typed error: a template that does not parse, naming the locale's field.
        broken = TemplateInputLocales()
        broken["en"] = LocaleContent(email_subject="Hi", email_body="Hello {{ order_id")
        bad_template = templates_put_template.sync_detailed(
            f"py-{run}-broken", client=client, body=TemplateInput(default_locale="en", locales=broken)
        )
        check(bad_template.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, f"broken template: {bad_template.status_code}")
        problem(bad_template.parsed, HTTPStatus.UNPROCESSABLE_ENTITY, "invalid_field", "locales.en.email_body")

        def request(order_id: str) -> NotificationRequest:
            return NotificationRequest(
                recipients=UserIds(user_ids=users),
                template_id=template_id,
                params=NotificationRequestParams.from_dict({"order_id": order_id}),
                category=Category.TRANSACTIONAL,
                channels=[Channel.EMAIL],
            )

        # Send with an Idempotency-Key header; the same key and body again is the same notification.
        idem = f"py-{run}-order-1"
        first = notifications_create.sync_detailed(client=client, body=request("1"), idempotency_key=idem)
        check(first.status_code == HTTPStatus.ACCEPTED, f"send: {first.status_code} {first.parsed!r}")
        check(isinstance(first.parsed, Accepted), f"send answered {first.parsed!r}")
        assert isinstance(first.parsed, Accepted)
        notification_id = first.parsed.notification_id
        again = notifications_create.sync_detailed(client=client, body=request("1"), idempotency_key=idem)
        check(again.status_code == HTTPStatus.ACCEPTED, f"send again: {again.status_code} {again.parsed!r}")
        check(
            isinstance(again.parsed, Accepted) and again.parsed.notification_id == notification_id,
            f"the same key and body answered {again.parsed!r}, not {notification_id}",
        )

        # 409 as a typed error: the same key with another body.
        conflict = notifications_create.sync_detailed(client=client, body=request("2"), idempotency_key=idem)
        check(conflict.status_code == HTTPStatus.CONFLICT, f"same key, other body: {conflict.status_code}")
        problem(conflict.parsed, HTTPStatus.CONFLICT, "idempotency_conflict")

        # 422 as a typed error: the header and the body's idempotency_key differ.
        both = request("1")
        both.idempotency_key = f"py-{run}-other"
        differ = notifications_create.sync_detailed(client=client, body=both, idempotency_key=idem)
        check(differ.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, f"header and body differ: {differ.status_code}")
        problem(differ.parsed, HTTPStatus.UNPROCESSABLE_ENTITY, "invalid_field", "Idempotency-Key")

        # Its status, until every email has gone to the (fake) provider.
        deadline = time.monotonic() + 60
        view: NotificationView | Problem | None = None
        while time.monotonic() < deadline:
            view = notifications_show.sync(notification_id, client=client)
            check(isinstance(view, NotificationView), f"GET notification answered {view!r}")
            assert isinstance(view, NotificationView)
            if view.status == NotificationStatus.COMPLETED and view.counts.sent + view.counts.delivered == 2:
                break
            time.sleep(0.2)
        else:
            fail(f"notification {notification_id} not completed in 60 s: {view!r}")
        assert isinstance(view, NotificationView)
        check(view.counts.failed == 0 and view.counts.dead == 0, f"counts: {view.counts!r}")

        # Its deliveries, one per page, following next_cursor.
        seen: list[tuple[str, Channel, DeliveryStatus]] = []
        cursor: str | Unset | None = None
        pages = 0
        while True:
            kwargs = {"limit": 1} if cursor is None or isinstance(cursor, Unset) else {"limit": 1, "cursor": cursor}
            page = notifications_deliveries.sync(notification_id, client=client, **kwargs)
            check(isinstance(page, DeliveryPage), f"deliveries answered {page!r}")
            assert isinstance(page, DeliveryPage)
            check(len(page.items) <= 1, f"limit=1 gave {len(page.items)} items")
            pages += 1
            seen.extend((d.user_id, d.channel, d.status) for d in page.items)
            cursor = page.next_cursor
            if cursor is None or isinstance(cursor, Unset):
                break
            check(pages < 10, "next_cursor never ends")
        check(
            sorted(u for u, _, _ in seen) == sorted(users),
            f"deliveries {seen!r}, expected one per user {users!r}",
        )
        check(all(c == Channel.EMAIL for _, c, _ in seen), f"channels: {seen!r}")
        check(
            all(s in (DeliveryStatus.SENT, DeliveryStatus.DELIVERED) for _, _, s in seen),
            f"statuses: {seen!r}",
        )
        check(pages >= 2, f"two deliveries at limit=1 came in {pages} page(s)")

    print(f"python client e2e: ok (notification {notification_id}, {len(seen)} deliveries in {pages} pages)")


if __name__ == "__main__":
    main()
