"""The service page's autoscaling cards and the rule editor, through Django's test client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from serving.autoscaling import Outcome
from serving.models import AutoScalingRule, ScaleEvent, Service
from tests.nexus.factories import make_user
from tests.serving.fleet import make_service, model_folder
from tests.support.personas import default_viewer

pytestmark = pytest.mark.django_db

PAGE = "/serving/services/chat/"
NEW = "/serving/services/chat/autoscaling/rules/new/"


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user("owner", staff=True))
    return client


@pytest.fixture
def member() -> Client:
    client = Client()
    client.force_login(default_viewer("teammate"))
    return client


@pytest.fixture
def chat() -> Iterator[Service]:
    with model_folder() as folder:
        yield make_service(folder, "chat", replicas=1)


def rule_form(**changes: str) -> dict[str, str]:
    values = {
        "metric_source": "inference_framework",
        "metric_name": "vllm:num_requests_waiting",
        "prometheus_preset": "",
        "prometheus_query": "",
        "condition": "scale_out",
        "min_threshold": "",
        "max_threshold": "5",
        "step_size": "1",
        "cooldown_s": "300",
        "min_replicas": "1",
        "max_replicas": "4",
        "aggregation": "avg",
        "window_s": "60",
    }
    values.update(changes)
    return values


def make_rule(service: Service, **changes: Any) -> AutoScalingRule:
    fields: dict[str, Any] = {
        "metric_source": "kernel",
        "metric_name": "cpu_util",
        "condition": "scale_in",
        "min_threshold": 10.0,
    }
    fields.update(changes)
    return AutoScalingRule.objects.create(service=service, **fields)


def test_staff_add_a_rule_and_the_page_lists_it_with_its_signed_step(
    staff: Client, chat: Service
) -> None:
    added = staff.post(NEW, rule_form())
    page = staff.get(PAGE).content.decode()

    assert added.status_code == 302
    assert added["Location"] == f"{PAGE}#autoscaling-rules"
    rule = AutoScalingRule.objects.get()
    assert f'<tr id="rule-{rule.pk}">' in page
    assert "<code>vllm:num_requests_waiting &gt; 5</code>" in page
    assert '<td class="num">+1</td>' in page
    assert ">never<" in page  # last triggered


def test_a_refused_rule_keeps_its_values_and_says_why(staff: Client, chat: Service) -> None:
    refused = staff.post(NEW, rule_form(max_threshold="", min_replicas="5"))

    html = refused.content.decode()
    assert refused.status_code == 200
    assert "Scaling out needs a max threshold." in html
    assert "Must be at least the min replicas." in html
    assert 'value="vllm:num_requests_waiting"' in html
    assert not AutoScalingRule.objects.exists()


def test_choosing_a_preset_fills_the_query_and_shows_the_current_value(
    staff: Client, chat: Service, settings: Any
) -> None:
    settings.NEXUS_PROMETHEUS_URL = ""
    redraw = rule_form(metric_source="prometheus", prometheus_preset="vllm-requests-waiting")

    html = staff.get(NEW, {**redraw, "redraw": "1"}).content.decode()

    assert "avg_over_time(vllm:num_requests_waiting{nexus_service=&quot;$service&quot;}" in html
    assert 'name="cooldown_s" value="60"' in html
    assert '<span class="preview-value">No data available (no Prometheus server' in html


def test_a_redraw_keeps_an_edited_query_and_signs_the_step(
    staff: Client, chat: Service, settings: Any
) -> None:
    settings.NEXUS_PROMETHEUS_URL = ""
    edited = rule_form(
        metric_source="prometheus",
        prometheus_preset="vllm-requests-waiting",
        applied_preset="vllm-requests-waiting",
        prometheus_query="max(up)",
        condition="scale_in",
        step_size="2",
    )

    html = staff.get(NEW, {**edited, "redraw": "1"}).content.decode()

    assert ">\nmax(up)</textarea>" in html
    assert "Shown as <strong>−2</strong>" in html


def test_the_preview_fragment_runs_the_query_for_this_service(
    staff: Client, chat: Service, settings: Any
) -> None:
    settings.NEXUS_PROMETHEUS_URL = ""

    html = staff.get(
        "/serving/services/chat/autoscaling/preview/",
        {"prometheus_query": "up{job='$service'}", "window_s": "30"},
        HTTP_HX_REQUEST="true",
    ).content.decode()

    assert 'id="rule-preview"' in html
    assert "up{job=&#x27;chat&#x27;}" in html
    assert "No data available" in html


def test_staff_edit_and_delete_a_rule(staff: Client, chat: Service) -> None:
    rule = make_rule(chat)
    base = f"/serving/services/chat/autoscaling/rules/{rule.pk}"

    edit_page = staff.get(f"{base}/edit/")
    edited = staff.post(
        f"{base}/edit/", rule_form(metric_source="kernel", metric_name="mem", max_threshold="9")
    )
    rule.refresh_from_db()
    confirm = staff.get(f"{base}/delete/")
    deleted = staff.post(f"{base}/delete/")

    assert 'value="cpu_util"' in edit_page.content.decode()
    assert edited.status_code == 302
    assert (rule.metric_name, rule.max_threshold) == ("mem", 9.0)
    assert "its 0 scale events are kept" in confirm.content.decode()
    assert deleted.status_code == 302
    assert not AutoScalingRule.objects.exists()


def test_a_viewer_sees_the_rules_but_no_way_to_change_them(member: Client, chat: Service) -> None:
    rule = make_rule(chat)

    page = member.get(PAGE).content.decode()

    assert f'<tr id="rule-{rule.pk}">' in page
    assert "Add rules" not in page
    assert member.get(NEW).status_code == 403
    assert member.post(NEW, rule_form()).status_code == 403
    assert (
        member.post(f"/serving/services/chat/autoscaling/rules/{rule.pk}/delete/").status_code
        == 403
    )


def test_rules_filter_by_ranges_and_come_in_pages(staff: Client, chat: Service) -> None:
    rules = [make_rule(chat) for _ in range(12)]
    AutoScalingRule.objects.filter(pk=rules[0].pk).update(last_triggered_at=timezone.now())
    since = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    fragment = "/serving/services/chat/autoscaling/rules/"

    first = staff.get(PAGE).content.decode()
    second = staff.get(fragment, {"rules_page": "2"}, HTTP_HX_REQUEST="true").content.decode()
    triggered = staff.get(
        fragment, {"triggered_after": since}, HTTP_HX_REQUEST="true"
    ).content.decode()
    bad = staff.get(fragment, {"created_after": "soon"}, HTTP_HX_REQUEST="true").content.decode()

    assert "Page 1 of 2 · 12 rules" in first
    assert f'id="rule-{rules[10].pk}"' not in first
    assert f'id="rule-{rules[10].pk}"' in second
    assert triggered.count('<tr id="rule-') == 1
    assert "Created after: &#x27;soon&#x27; is not an ISO date-time." in bad


def test_scale_events_show_each_decision_with_its_value(staff: Client, chat: Service) -> None:
    rule = make_rule(chat)
    ScaleEvent.objects.create(
        service=chat,
        rule=rule,
        rule_text="cpu_util < 10",
        metric_source="kernel",
        value=4.25,
        series=2,
        window_s=60,
        aggregation="avg",
        replicas_before=3,
        replicas_after=2,
        outcome=Outcome.SCALED_IN,
        reason="4.25 < 10: 3 → 2",
    )

    card = staff.get("/serving/services/chat/autoscaling/events/").content.decode()

    assert 'data-outcome="scaled_in"' in card
    assert "4.25" in card
    assert "3 → 2" in card
    assert "Scaled in" in card
    assert "avg over 1 min, 2 series" in card


def test_a_service_without_rules_says_what_to_do(staff: Client, chat: Service) -> None:
    page = staff.get(PAGE).content.decode()

    assert "No autoscaling rules" in page
    assert "No scale events yet" in page


def test_another_projects_service_is_not_found(chat: Service, member: Client) -> None:
    Service.objects.filter(pk=chat.pk).update(project="elsewhere")

    assert member.get("/serving/services/chat/autoscaling/events/").status_code == 404


def test_the_page_says_whether_a_service_that_scales_to_zero_sleeps_or_wakes(
    staff: Client, chat: Service
) -> None:
    Service.objects.filter(pk=chat.pk).update(scale_to_zero_after_s=300, desired_replicas=0)
    asleep = staff.get(PAGE).content.decode()
    Service.objects.filter(pk=chat.pk).update(desired_replicas=1)
    ScaleEvent.objects.create(
        service=chat,
        rule_text="scale to zero after 300 s idle",
        value=1.0,
        window_s=0,
        replicas_before=0,
        replicas_after=1,
        outcome=Outcome.SCALED_OUT,
        reason="1 request waiting: woken",
    )
    waking = staff.get(PAGE).content.decode()

    assert "after 5 min without requests:" in asleep
    assert "asleep, 0 replicas — the next request wakes it" in asleep
    assert "waking — a request waits while a replica starts" in waking


SCALE_TO_ZERO = "/serving/services/chat/autoscaling/scale-to-zero/"


def test_staff_set_and_clear_scale_to_zero_from_the_rules_card(
    staff: Client, chat: Service
) -> None:
    set_answer = staff.post(SCALE_TO_ZERO, {"scale_to_zero_after_s": "120"}, HTTP_HX_REQUEST="true")
    chat.refresh_from_db()
    assert chat.scale_to_zero_after_s == 120
    assert 'id="scale-to-zero"' in set_answer.content.decode()  # the card says it scales to zero

    staff.post(SCALE_TO_ZERO, {"scale_to_zero_after_s": ""}, HTTP_HX_REQUEST="true")
    chat.refresh_from_db()
    assert chat.scale_to_zero_after_s is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [("5", "At least 10 s, or blank for never."), ("soon", "Enter a whole number of seconds")],
)
def test_a_refused_idle_time_is_shown_next_to_its_field_and_changes_nothing(
    staff: Client, chat: Service, value: str, problem: str
) -> None:
    answer = staff.post(SCALE_TO_ZERO, {"scale_to_zero_after_s": value}, HTTP_HX_REQUEST="true")

    page = answer.content.decode()
    assert 'id="scale-to-zero-error"' in page and problem in page
    assert f'value="{value}"' in page  # kept for correcting
    chat.refresh_from_db()
    assert chat.scale_to_zero_after_s is None


def test_a_viewer_may_not_set_scale_to_zero(member: Client, chat: Service) -> None:
    assert 'id="scale-to-zero-form"' not in member.get(PAGE).content.decode()
    assert member.post(SCALE_TO_ZERO, {"scale_to_zero_after_s": "60"}).status_code == 403
    chat.refresh_from_db()
    assert chat.scale_to_zero_after_s is None


def test_the_rule_editor_is_in_the_services_area_of_the_navigation(
    staff: Client, chat: Service
) -> None:
    page = staff.get(NEW).content.decode()

    assert '<a href="/serving/services/" aria-current="page">Services</a>' in page
