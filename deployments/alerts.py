"""Alerts: Prefect automations that tell someone when a tfopt run fails or regresses.

`register_alerts` (``tfopt deploy``) registers two automations on the Prefect server: a flow run
of a tfopt deployment (tagged ``tfopt``) that ends Failed or Crashed, and a confirmed regression
(the ``tfopt.regression`` event a pipeline run emits, `tfopt.prefect_artifacts`), each send a
notification through the notification block named ``tfopt-alerts``. The server's own trigger and
action services run them: no tfopt process has to be up when a nightly run fails.

The block is the user's: a webhook (`save_webhook`, ``tfopt deploy --alert-webhook URL``), or
any Prefect notification block (Slack, e-mail, Microsoft Teams, ...) created in the Prefect UI
under that name. Without one, no automation is registered and ``tfopt deploy`` says how to add it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tfopt.prefect_artifacts import REGRESSION_EVENT

ALERT_BLOCK = "tfopt-alerts"
"""The name of the notification block the alerts are sent through (any notification type)."""

DEPLOYMENT_TAG = "tfopt"
"""The tag every tfopt deployment carries (`deployments/prefect.yaml`, `tfopt worker`'s)."""

FAILED = "tfopt: a deployment run failed"
REGRESSED = "tfopt: a regression confirmed"

_FAILED_BODY = (
    "{{ flow.name }}/{{ deployment.name }}: flow run {{ flow_run.name }} ended "
    "{{ flow_run.state.name }}: {{ flow_run.state.message }}\n{{ flow_run|ui_url }}"
)
_REGRESSED_BODY = (
    "config {{ event.resource['prefect.resource.name'] }} regressed since its last run:"
    "{% for move in event.payload.regressions %}\n- {{ move.variant }}: {{ move.what }} "
    "{{ move.before }} -> {{ move.after }} ({{ move.direction }}){% endfor %}\n"
    "{{ event.payload.run_url }}"
)


def save_webhook(url: str) -> UUID:
    """Save (or replace) the ``tfopt-alerts`` block as a webhook POSTing JSON to `url`.

    The JSON holds ``subject`` and ``body``, the automation's text; a receiver that wants
    another shape (Slack's ``text``) is better served by its own Prefect block of that name.
    """
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name="tfopt", url=url, method="POST",
        json_data={"subject": "{{subject}}", "body": "{{body}}", "source": "tfopt"})
    return block.save(ALERT_BLOCK, overwrite=True)


def alert_block(client: Any) -> Any | None:
    """The notification block document named ``tfopt-alerts``, of any type (None: none)."""
    for document in client.read_block_documents():
        if document.name == ALERT_BLOCK and "notify" in (
                document.block_schema.capabilities if document.block_schema else []):
            return document
    return None


def _automations(block_id: UUID) -> list[Any]:
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    def notify(subject: str, body: str) -> list[Any]:
        return [SendNotification(block_document_id=block_id, subject=subject, body=body)]

    return [
        AutomationCore(
            name=FAILED,
            description="A flow run of a tfopt deployment ended Failed or Crashed.",
            trigger=EventTrigger(
                expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                match_related={"prefect.resource.role": "tag",
                               "prefect.resource.id": f"prefect.tag.{DEPLOYMENT_TAG}"},
                posture=Posture.Reactive, threshold=1),
            actions=notify("tfopt: {{ deployment.name }} {{ flow_run.state.name }}",
                           _FAILED_BODY)),
        AutomationCore(
            name=REGRESSED,
            description="A tfopt run confirmed a regression since its last run.",
            trigger=EventTrigger(expect={REGRESSION_EVENT}, posture=Posture.Reactive,
                                 threshold=1),
            actions=notify("tfopt: {{ event.resource['prefect.resource.name'] }} regressed",
                           _REGRESSED_BODY)),
    ]


def register_alerts() -> list[str]:
    """Register (or replace) the alert automations; one line per automation, or why none.

    Idempotent: automations of the same names are deleted first, so a changed block or text
    takes effect on the next ``tfopt deploy``.
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        block = alert_block(client)
        if block is None:
            return [f"alerts: none registered (no notification block named {ALERT_BLOCK}: "
                    "tfopt deploy --alert-webhook URL, or a Slack or e-mail block of that name "
                    "created in the Prefect UI, then tfopt deploy)"]
        lines = []
        for automation in _automations(block.id):
            for existing in client.read_automations_by_name(automation.name):
                client.delete_automation(existing.id)
            created = client.create_automation(automation)
            lines.append(f"alert: {automation.name} -> {block.block_type.name} {ALERT_BLOCK} "
                         f"({created})")
        return lines


def send_test_alert() -> str:
    """Send one notification through the ``tfopt-alerts`` block; say where it went.

    Raises:
        LookupError: There is no such block.
    """
    from prefect.blocks.core import Block
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        document = alert_block(client)
    if document is None:
        raise LookupError(f"no notification block named {ALERT_BLOCK} (tfopt deploy "
                          "--alert-webhook URL, or create one in the Prefect UI)")
    block = Block.load(f"{document.block_type.slug}/{ALERT_BLOCK}")
    block.notify("tfopt alerts test: this block receives tfopt's failure and regression alerts.",
                 subject="tfopt: test alert")
    return f"sent a test alert through {document.block_type.name} {ALERT_BLOCK}"
