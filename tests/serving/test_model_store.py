"""The model store: cards from the model-store project's folders, what makes one deployable,
search, sort and pages, the drawer's README (safe Markdown), and deploying a card."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings

from nexus.models import Project
from nexus.ui import markdown
from serving import store
from serving.definitions.model_card import ModelCard, fits, parse_model_card, read_model_card
from serving.models import ModelFolder, ResourcePreset, Service
from serving.store_seed import (
    HTTP_SERVER_FOLDER,
    SIMULATOR_LARGE_FOLDER,
    SIMULATOR_SMALL_FOLDER,
    SMOLLM2_FOLDER,
    seed_store,
    write_seeds,
)
from tests.nexus.factories import make_user

GIB = 1 << 30


@pytest.fixture
def seeded(settings: Settings, tmp_path: Path) -> Path:
    """The seed cards, in a data dir of the test's own."""
    settings.DATA_DIR = tmp_path
    write_seeds()
    return tmp_path


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(make_user("staff", staff=True))
    return client


def only_presets(*presets: tuple[str, float, int]) -> None:
    """Replace the installation's presets with these (name, cpu, memory bytes)."""
    ResourcePreset.objects.all().delete()
    for name, cpu, memory in presets:
        ResourcePreset.objects.create(name=name, cpu=cpu, memory_bytes=memory)


# The card file and the fit rule (pure)


def test_a_card_file_gives_every_field_and_reads_a_number_as_text() -> None:
    card = parse_model_card("title: Qwen\nversion: 1.5\nlabels: [chat]\nframeworks: vLLM\n")

    assert card == ModelCard(title="Qwen", version="1.5", labels=("chat",), frameworks=("vLLM",))


def test_a_broken_card_file_gives_an_empty_card_that_says_why() -> None:
    card = read_model_card("title: [unclosed\n")
    unknown = read_model_card("titel: typo\n")

    assert (card.title, [str(p) for p in card.problems]) == ("", ["is not valid YAML (line 2)"])
    assert [p.path for p in unknown.problems] == ["titel"]


def test_a_preset_fits_a_model_with_every_slot_in_full_and_gpus_only_for_gpu_models() -> None:
    small = {"cpu": 1.0, "mem": GIB, "cuda.shares": 0.0}
    gpu = {"cpu": 4.0, "mem": 16 * GIB, "cuda.shares": 1.0}

    assert fits(small, {"cpu": 1, "mem": GIB})
    assert not fits(small, {"cpu": 2})
    assert not fits(gpu, {"cpu": 1})  # a GPU the model never uses
    assert fits(gpu, {"cpu": 1, "cuda.shares": 1})
    assert not fits(small, {"cuda.shares": 0.5})


# Safe Markdown (done-when 3)


def test_a_readme_with_a_script_tag_renders_without_it() -> None:
    html = markdown.render(
        "# Model <script>alert('x')</script>\n\n"
        '<img src=x onerror="alert(1)">\n\n'
        "[safe](https://example.org) [unsafe](javascript:alert(1)) `<b>code</b>`\n\n"
        "```\n<script>also</script>\n```\n"
    )

    assert "<script" not in html
    assert "<img" not in html
    assert "javascript:" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert '<a href="https://example.org" rel="nofollow noopener">safe</a>' in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html


def test_markdown_renders_headings_lists_emphasis_and_code_blocks() -> None:
    html = markdown.render("## Use\n\n- **fast**\n- *small*\n\n1. one\n\n```\nx = 1\n```\n")

    assert html == (
        "<h2>Use</h2>\n<ul><li><strong>fast</strong></li><li><em>small</em></li></ul>\n"
        "<ol><li>one</li></ol>\n<pre><code>x = 1</code></pre>"
    )


@pytest.mark.django_db
def test_the_drawer_shows_the_readme_without_its_script(staff: Client, seeded: Path) -> None:
    (seeded / "models" / HTTP_SERVER_FOLDER / "README.md").write_text(
        "# Files\n\n<script>document.title = 'owned'</script>\n"
    )

    page = staff.get(f"/store/{HTTP_SERVER_FOLDER}/", HTTP_HX_REQUEST="true").content.decode()

    assert "<h1>Files</h1>" in page
    assert "<script>document.title" not in page
    assert "&lt;script&gt;document.title" in page


# The gallery


@pytest.mark.django_db
def test_without_the_store_project_the_page_says_it_was_not_found(
    staff: Client, settings: Settings
) -> None:
    settings.NEXUS_MODEL_STORE_PROJECT = "nowhere"

    page = staff.get("/store/").content.decode()

    assert "Model store project not found." in page
    assert "Ask an administrator" in page


@pytest.mark.django_db
def test_the_seed_cards_are_listed_and_those_that_cannot_deploy_say_why(
    staff: Client, seeded: Path
) -> None:
    page = staff.get("/store/").content.decode()

    for title in ("Simple HTTP server", "Simulated 70B chat model", "Simulated 8B chat model"):
        assert title in page
    smollm2 = store.store_card(store.store_project(), SMOLLM2_FOLDER)  # type: ignore[arg-type]
    assert smollm2 is not None and "SmolLM2 135M Instruct" in page
    if smollm2.blocked:  # without llama.cpp (or the model file) it is dimmed, saying why
        assert f'<li class="store-card blocked" id="card-{SMOLLM2_FOLDER}"' in page
        assert smollm2.blocked in page


@pytest.mark.django_db
def test_a_card_with_no_fitting_preset_is_dimmed_and_its_drawer_says_it_cannot_deploy(
    staff: Client, seeded: Path
) -> None:
    only_presets(("tiny", 0.5, 512 << 20))

    gallery = staff.get("/store/").content.decode()
    drawer = staff.get(f"/store/{SIMULATOR_LARGE_FOLDER}/", HTTP_HX_REQUEST="true")

    assert f'<li class="store-card blocked" id="card-{SIMULATOR_LARGE_FOLDER}"' in gallery
    assert f'<li class="store-card" id="card-{SIMULATOR_SMALL_FOLDER}"' in gallery
    assert "No compatible preset: this model cannot be deployed" in drawer.content.decode()
    assert '<button type="button" class="button primary" disabled' in drawer.content.decode()


@pytest.mark.django_db
def test_a_card_needs_both_definition_files_to_deploy(staff: Client, seeded: Path) -> None:
    (seeded / "models" / HTTP_SERVER_FOLDER / "service-definition.toml").unlink()

    card = store.store_card(store.store_project(), HTTP_SERVER_FOLDER)  # type: ignore[arg-type]

    assert card is not None and card.blocked == store.NEEDS_BOTH_FILES


@pytest.mark.django_db
def test_search_sort_and_page_size_choose_the_cards(staff: Client, seeded: Path) -> None:
    def titles(query: str) -> list[str]:
        page = staff.get(f"/store/?{query}", HTTP_HX_REQUEST="true").content.decode()
        return re.findall(r'<span class="store-card-title">([^<]*)</span>', page)

    assert titles("q=simulat") == ["Simulated 70B chat model", "Simulated 8B chat model"]
    assert titles("q=SIMULATOR-8") == ["Simulated 8B chat model"]  # the folder's name too
    assert titles("sort=-name")[0] == "SmolLM2 135M Instruct"
    ModelFolder.objects.filter(name=HTTP_SERVER_FOLDER).update(created_at="2020-01-01T00:00Z")
    assert titles("sort=created")[0] == "Simple HTTP server"
    assert titles("sort=-created")[-1] == "Simple HTTP server"
    for number in range(9):
        ModelFolder.objects.create(name=f"extra-{number}", project="model-store")
    assert len(titles("per_page=10")) == 10
    assert len(titles("per_page=10&page=2")) == 3
    assert len(titles("per_page=20")) == 13
    page = staff.get("/store/?q=nothing-like-it").content.decode()
    assert "No models found." in page


# Deploying


@pytest.mark.django_db
def test_a_card_with_one_preset_and_one_group_deploys_in_one_click(
    staff: Client, seeded: Path
) -> None:
    only_presets(("tiny", 0.5, 512 << 20), ("small", 1.0, GIB))

    drawer = staff.get(f"/store/{SIMULATOR_LARGE_FOLDER}/", HTTP_HX_REQUEST="true").content
    answer = staff.post(
        f"/store/{SIMULATOR_LARGE_FOLDER}/deploy/",
        {"option": "custom:small", "resource_group": drawer_group(drawer.decode())},
        HTTP_HX_REQUEST="true",
    )

    assert 'hx-post="/store/simulator-70b/deploy/"' in drawer.decode()
    assert "data-dialog" not in drawer.decode()
    service = Service.objects.get(name="simulator-70b")
    assert service.latest_revision is not None
    assert service.latest_revision.preset is not None
    assert service.latest_revision.preset.name == "small"
    assert service.latest_revision.resource_slots == {"cpu": 1.0, "mem": GIB, "cuda.shares": 0.0}
    assert 'hx-get="/store/-/deploying/simulator-70b/"' in answer.content.decode()
    waiting = staff.get("/store/-/deploying/simulator-70b/", HTTP_HX_REQUEST="true")
    assert "HX-Redirect" not in waiting  # no replica answers yet
    assert "waiting for its endpoint to answer" in waiting.content.decode()


def drawer_group(html: str) -> str:
    marker = 'name="resource_group" value="'
    return html[html.index(marker) + len(marker) :].split('"')[0]


@pytest.mark.django_db
def test_a_card_with_several_presets_asks_in_a_modal_grouped_by_runtime_variant(
    staff: Client, seeded: Path
) -> None:
    only_presets(("tiny", 0.5, 512 << 20), ("small", 1.0, GIB))

    drawer = staff.get(f"/store/{SIMULATOR_SMALL_FOLDER}/", HTTP_HX_REQUEST="true").content
    form = staff.get(f"/store/{SIMULATOR_SMALL_FOLDER}/deploy/").content.decode()
    answer = staff.post(
        f"/store/{SIMULATOR_SMALL_FOLDER}/deploy/",
        {"option": "simulator:tiny", "resource_group": drawer_group_of(form)},
    )

    assert 'data-dialog="deploy-modal-simulator-8b"' in drawer.decode()
    assert '<optgroup label="Simulator">' in form
    assert '<optgroup label="Custom">' in form
    assert answer.status_code == 302 and answer["Location"] == "/serving/services/simulator-8b/"
    revision = Service.objects.get(name="simulator-8b").latest_revision
    assert revision is not None and revision.runtime_variant == "simulator"
    # Deployed twice, the second service takes the next free name.
    staff.post(
        f"/store/{SIMULATOR_SMALL_FOLDER}/deploy/",
        {"option": "custom:small", "resource_group": drawer_group_of(form)},
    )
    assert Service.objects.filter(name="simulator-8b-2").exists()


def drawer_group_of(form: str) -> str:
    marker = '<option value="'
    start = form.index('name="resource_group"')
    return form[form.index(marker, start) + len(marker) :].split('"')[0]


@pytest.mark.django_db
def test_only_staff_deploy(client: Client, seeded: Path) -> None:
    client.force_login(make_user("teammate"))

    drawer = client.get(f"/store/{SIMULATOR_SMALL_FOLDER}/", HTTP_HX_REQUEST="true")
    refused = client.post(f"/store/{SIMULATOR_SMALL_FOLDER}/deploy/", {})

    assert "Staff deploy models." in drawer.content.decode()
    assert refused.status_code == 403
    assert not Service.objects.exists()


# Seeds


@pytest.mark.django_db
def test_seeds_are_written_after_migrate_unless_turned_off(
    settings: Settings, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path
    settings.NEXUS_MODEL_STORE_SEED = False
    seed_store(using="default")
    assert not ModelFolder.objects.exists()

    settings.NEXUS_MODEL_STORE_SEED = True
    seed_store(using="default")

    assert set(ModelFolder.objects.values_list("name", "project")) == {
        (SMOLLM2_FOLDER, "model-store"),
        (SIMULATOR_SMALL_FOLDER, "model-store"),
        (SIMULATOR_LARGE_FOLDER, "model-store"),
        (HTTP_SERVER_FOLDER, "model-store"),
    }
    assert Project.objects.filter(name="model-store").exists()
    for name in (SMOLLM2_FOLDER, SIMULATOR_SMALL_FOLDER, HTTP_SERVER_FOLDER):
        assert (tmp_path / "models" / name / "model-definition.yaml").is_file()


@pytest.mark.django_db
def test_seeding_again_keeps_what_someone_changed(seeded: Path) -> None:
    readme = seeded / "models" / HTTP_SERVER_FOLDER / "README.md"
    readme.write_text("# Ours\n")
    (seeded / "models" / HTTP_SERVER_FOLDER / "model-card.yaml").unlink()

    write_seeds()

    assert readme.read_text() == "# Ours\n"
    assert (seeded / "models" / HTTP_SERVER_FOLDER / "model-card.yaml").is_file()
    assert ModelFolder.objects.filter(name=HTTP_SERVER_FOLDER).count() == 1


@pytest.mark.django_db
def test_the_gallery_costs_the_same_queries_for_four_cards_or_fifty(
    staff: Client, seeded: Path
) -> None:
    staff.get("/store/")  # the session, once
    with CaptureQueriesContext(connection) as four:
        staff.get("/store/?per_page=50")
    for number in range(46):
        ModelFolder.objects.create(name=f"extra-{number}", project="model-store")

    with CaptureQueriesContext(connection) as fifty:
        page = staff.get("/store/?per_page=50")

    assert "1–50 of 50 models" in page.content.decode()
    assert len(fifty.captured_queries) == len(four.captured_queries) <= 8


@pytest.mark.django_db
def test_the_smollm2_card_is_dimmed_with_why_where_llama_cpp_or_its_model_file_is_missing(
    staff: Client, seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = seeded / "models" / SMOLLM2_FOLDER
    for gguf in folder.glob("*.gguf"):
        gguf.unlink()
    project = store.store_project()
    assert project is not None

    # What this machine has installed is a fact the test sets, not Nexus's code: `make
    # test-fast` runs without llama.cpp, `make test` with it.
    monkeypatch.setattr(store, "llama_cpp_installed", lambda: True)
    without_file = store.store_card(project, SMOLLM2_FOLDER)
    monkeypatch.setattr(store, "llama_cpp_installed", lambda: False)
    without_llama = store.store_card(project, SMOLLM2_FOLDER)
    page = staff.get("/store/").content.decode()

    assert without_file is not None and without_file.blocked.startswith(
        "the folder holds no .gguf model file"
    )
    assert without_llama is not None
    assert without_llama.blocked == (
        "llama.cpp is not installed here (make llama adds llama-cpp-python)"
    )
    assert f'<li class="store-card blocked" id="card-{SMOLLM2_FOLDER}"' in page
    assert "llama.cpp is not installed here" in page
