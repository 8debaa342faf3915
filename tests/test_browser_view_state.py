"""One state between the instant view and its page, in a real browser (Chromium via Playwright,
the server of ``tests/test_browser.py``).

With the pointer over the view (no click), ←/→ step the head and ↑/↓ the layer in the browser;
once the keys rest the page follows: its Head box and layer slider, the chart's title and the
URL show what the view shows. A step never pins the query (a click does), and the page's
re-render with the new head does not make the view report again."""

from __future__ import annotations

import re

import pytest

from model_folders import narrow_swin
from streamlit_server import CHROMIUM
from test_browser import (  # noqa: F401 - fixtures
    artifacts,
    assert_no_exception,
    attention_view_frame,
    chromium,
    page,
    server,
    view_patch_position,
    wait_idle,
)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian Chromium not installed at /usr/bin/chromium")


def url_params(page) -> dict[str, str]:
    query = page.url.split("?", 1)[1] if "?" in page.url else ""
    return dict(part.split("=", 1) for part in query.split("&") if "=" in part)


def view_state(frame) -> dict:
    return frame.evaluate("""() => { const v = window.attentionView;
        return {head: v.head, layer: v.layer, shownHead: v.shown && v.shown.head, pinned: v.pinnedPatch,
                reports: v.reports, told: v.told, focused: document.hasFocus(),
                headText: document.getElementById('head').textContent.trim()}; }""")


def hover_view(page, frame, grid: tuple[int, int]) -> None:
    """Put the pointer over the view's map (patch (1, 2), not the page's default query patch), without clicking."""
    gh, gw = grid
    page.mouse.move(*view_patch_position(page, frame, gw + 2, grid))
    frame.wait_for_function("() => window.attentionView.hover !== null")


def view_grid(frame) -> tuple[int, int]:
    return tuple(frame.evaluate("() => window.attentionView.args.grid"))


def test_hovering_the_view_and_pressing_right_steps_the_head_and_the_page_follows(page, server, artifacts):
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    frame = attention_view_frame(page)
    title = page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")
    expect(title).to_contain_text("mean over heads")
    layer = frame.evaluate("() => window.attentionView.args.layer")
    before, params = view_state(frame), url_params(page)
    assert before["head"] == frame.evaluate("() => window.attentionView.args.heads")  # the mean
    assert not before["focused"]  # nothing has given the view the keyboard yet
    hover_view(page, frame, view_grid(frame))
    frame.wait_for_function("() => document.hasFocus()", timeout=5_000)  # the pointer alone gave it the keys
    page.keyboard.press("ArrowRight")  # mean over heads -> head 0
    frame.wait_for_function("() => window.attentionView.shown?.head === 0")
    assert view_state(frame)["headText"] == "head 0"

    expect(page.get_by_role("combobox", name="Head")).to_have_value("head 0", timeout=30_000)
    expect(title).to_contain_text(f"Layer {layer} · head 0 · query: class token", timeout=30_000)
    page.wait_for_function("() => new URLSearchParams(location.search).get('head') === '0'", timeout=20_000)
    wait_idle(page)
    assert_no_exception(page, "a head step in the view")
    frame = attention_view_frame(page)
    # not pinned: the query is still the class token everywhere, and the view's pin did not move
    expect(page.get_by_role("radio", name="class token")).to_be_checked()
    assert url_params(page) == {**params, "head": "0"}, page.url  # the head alone changed
    after = view_state(frame)
    assert after["pinned"] is None and after["head"] == 0 and after["told"] == {"layer": None, "head": None}, after
    # one report (the step) and no echo: the page's re-render with head 0 made the view say nothing
    page.wait_for_timeout(1_000)
    assert view_state(frame)["reports"] == before["reports"] + 1
    page.screenshot(path=str(artifacts / "view_state_head_step.png"))

    # the pointer leaves: the keys are the page's again
    page.mouse.move(5, 5)
    frame.wait_for_function("() => !document.hasFocus()", timeout=5_000)
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(500)
    assert view_state(frame)["head"] == 0


def test_layer_and_head_steps_in_one_go_reach_the_page_in_one_report(page, server):
    """↓ and →, → (and ▶ pressed in the view) before the keys rest: the page follows both the layer and
    the head, and a click afterwards still pins the patch with them."""
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    frame = attention_view_frame(page)
    layer = frame.evaluate("() => window.attentionView.args.layer")
    assert layer >= 1, "the test needs a layer below the shown one"
    before = view_state(frame)
    grid = view_grid(frame)
    hover_view(page, frame, grid)
    frame.wait_for_function("() => document.hasFocus()", timeout=5_000)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")  # head 0
    page.keyboard.press("ArrowRight")  # head 1
    frame.wait_for_function(
        f"() => window.attentionView.shown?.head === 1 && window.attentionView.shown?.layer === {layer - 1}"
    )
    layer_slider = page.locator("[data-testid='stSlider']", has_text="Layer (block index)").get_by_role("slider")
    expect(layer_slider).to_have_value(str(layer - 1), timeout=30_000)
    expect(page.get_by_role("combobox", name="Head")).to_have_value("head 1", timeout=30_000)
    title = page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")
    expect(title).to_contain_text(f"Layer {layer - 1} · head 1 · query: class token", timeout=30_000)
    page.wait_for_function(
        f"() => {{ const p = new URLSearchParams(location.search);"
        f" return p.get('head') === '1' && p.get('layer') === '{layer - 1}'; }}",
        timeout=20_000,
    )
    wait_idle(page)
    frame = attention_view_frame(page)
    assert view_state(frame)["reports"] == before["reports"] + 1  # the three keys: one report
    expect(page.get_by_role("radio", name="class token")).to_be_checked()

    # the view's ▶ button steps the head as → does (a click on a button pins nothing)
    frame.locator("#next").click()
    expect(page.get_by_role("combobox", name="Head")).to_have_value("head 2", timeout=30_000)
    expect(title).to_contain_text(f"Layer {layer - 1} · head 2 · query: class token", timeout=30_000)
    wait_idle(page)
    frame = attention_view_frame(page)

    # a click pins the patch, with the head and layer the view shows
    gh, gw = grid
    patch = gw + 1
    page.mouse.click(*view_patch_position(page, frame, patch, grid))
    expect(page.get_by_label(re.compile(r"Query patch \(row-major"))).to_have_value(str(patch), timeout=30_000)
    expect(title).to_contain_text(f"Layer {layer - 1} · head 2 · query: patch {patch} (row", timeout=30_000)
    wait_idle(page)
    assert_no_exception(page, "steps and a click in the view")


def test_a_step_taken_while_the_page_answers_the_last_one_is_not_undone_by_its_answer(page, server):
    """→ is reported; → again, and the page's answer to the first (head 0) arrives before the keys
    rest: it must not move the view back from head 1, and the page ends on head 1 (the view reports
    it once the keys rest)."""
    from playwright.sync_api import expect

    page.goto(server)
    wait_idle(page)
    frame = attention_view_frame(page)
    hover_view(page, frame, view_grid(frame))
    frame.wait_for_function("() => document.hasFocus()", timeout=5_000)
    # the page's answers are held back (the frame's postMessage, which the page calls, keeps them)
    # until released, so that the second step comes before the answer to the first
    frame.evaluate("""() => { window.heldRenders = [];
        const post = window.postMessage.bind(window);
        window.postMessage = (data, ...rest) => {
            if (window.heldRenders && data && data.type === 'streamlit:render') window.heldRenders.push(data);
            else post(data, ...rest);
        }; }""")
    page.keyboard.press("ArrowRight")  # head 0
    frame.wait_for_function("() => window.attentionView.told.head === 0")  # reported
    frame.wait_for_function("() => window.heldRenders.some(m => m.args.head === 0)")  # answered, not yet heard
    assert frame.evaluate("() => [window.attentionView.args.head, window.attentionView.told.head]") == [
        frame.evaluate("() => window.attentionView.args.heads"),
        0,
    ]  # the view has not heard the answer
    # head 1, and at once (while the view waits for the keys to rest) the answer to head 0 arrives
    since = frame.evaluate("""() => { const since = window.attentionView.paints.length;
        window.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowRight'}));
        const held = window.heldRenders; window.heldRenders = null;
        for (const data of held) window.dispatchEvent(new MessageEvent('message', {data: data}));
        return since; }""")
    frame.wait_for_function("() => window.attentionView.shown?.head === 1", timeout=10_000)
    expect(page.get_by_role("combobox", name="Head")).to_have_value("head 1", timeout=30_000)
    page.wait_for_function("() => new URLSearchParams(location.search).get('head') === '1'", timeout=20_000)
    wait_idle(page)
    frame = attention_view_frame(page)
    heads = frame.evaluate(f"() => window.attentionView.paints.slice({since}).map(p => p.head)")
    assert heads and set(heads) == {1}, heads  # never back to head 0
    assert view_state(frame)["told"] == {"layer": None, "head": None}


@pytest.mark.parametrize(
    "where, path, header",
    [
        ("compare", "/compare", "Compare layers"),
        ("windowed", "/?model={swin}&layer=1", "Attention"),
    ],
)
def test_a_head_step_in_the_view_moves_every_pages_head_box(page, server, where, path, header):
    """The Compare page's panels and a windowed model's (Swin's) view follow the same rule: the Head
    box, what the page draws for that head, and the URL follow a head step; the query stays."""
    from playwright.sync_api import expect

    page.goto(server + path.format(swin=narrow_swin()))  # a narrow Swin-T at 112 px
    expect(page.locator("h2", has_text=header).first).to_be_visible(timeout=60_000)
    wait_idle(page)
    frame = attention_view_frame(page)
    params = url_params(page)
    hover_view(page, frame, view_grid(frame))
    frame.wait_for_function("() => document.hasFocus()", timeout=5_000)
    page.keyboard.press("ArrowRight")
    frame.wait_for_function("() => window.attentionView.shown && window.attentionView.shown?.head === 0")
    expect(page.get_by_role("combobox", name="Head")).to_have_value("head 0", timeout=30_000)
    page.wait_for_function("() => new URLSearchParams(location.search).get('head') === '0'", timeout=20_000)
    wait_idle(page)
    if where == "compare":  # the panels' caption names the head
        expect(page.get_by_text(re.compile(r"^head 0 · query: "))).to_be_visible()
    else:  # the chart's title
        expect(page.locator("[data-testid='stPlotlyChart']").first.locator(".gtitle")).to_contain_text(" · head 0 · ")
    assert url_params(page) == {**params, "head": "0"}, page.url  # the head alone: the query was not pinned
    assert view_state(attention_view_frame(page))["pinned"] is None
    assert_no_exception(page, f"a head step in the {where} view")


def test_hovering_the_view_does_not_take_the_keys_from_a_field_being_typed_in(page, server):
    """The Query patch field has the focus: passing over the view leaves it there, and ↑ steps the
    field, not the view's layer."""
    from playwright.sync_api import expect

    page.goto(f"{server}/?query=patch&patch=21")
    wait_idle(page)
    frame = attention_view_frame(page)
    layer = frame.evaluate("() => window.attentionView.layer")
    field = page.get_by_label(re.compile(r"Query patch \(row-major"))
    field.focus()
    hover_view(page, frame, view_grid(frame))
    page.wait_for_timeout(500)
    assert not frame.evaluate("() => document.hasFocus()")
    assert field.evaluate("element => element === document.activeElement")
    page.keyboard.press("ArrowUp")
    expect(field).to_have_value("22")
    page.wait_for_timeout(500)
    assert frame.evaluate("() => window.attentionView.layer") == layer


def decoded_params(page) -> dict[str, object]:
    from urllib.parse import parse_qsl, urlsplit

    from vizapp.url_state import decode_setting

    return {key: decode_setting(value) for key, value in parse_qsl(urlsplit(page.url).query, keep_blank_values=True)}


@pytest.mark.parametrize(
    "path, settings, shown",
    [
        ("tokens", {"layer": 1, "tok_kind": "query", "tok_foreground": True}, "layer 1"),
        ("rollout", {"fusion": "max", "discard_ratio": 0.05, "rollout_norm": False}, "max"),
        ("explain", {"explain_methods": ["attention"], "explain_compare": True}, "Second class"),
        ("circuits", {"circ_ablate": False, "circ_method": "mean"}, "Ablate every head"),
    ],
)
def test_a_link_opens_each_pages_settings_and_keeps_them_through_a_rerun(page, server, path, settings, shown):
    """A page's own settings from a link: the page draws with them, the URL keeps them, and they
    survive the next rerun (the browser's own widget values come back with it: a widget the
    browser drew with its default would undo the link here)."""
    from urllib.parse import urlencode

    from playwright.sync_api import expect

    from vizapp.url_state import encode_setting

    page.goto(f"{server}/{path}?{urlencode({k: encode_setting(v) for k, v in settings.items()})}")
    wait_idle(page)
    assert_no_exception(page, f"{path} from a link")
    expect(page.get_by_text(shown).first).to_be_visible()  # drawn with the link's settings:
    if path == "rollout":
        slider = page.locator("[data-testid='stSlider']", has_text="Discard ratio")
        expect(slider.locator("[data-testid='stSliderThumbValue']")).to_have_text("0.05")
    if path == "circuits":
        toggle = page.locator("[data-testid='stCheckbox']", has_text="Ablate every head").locator("input")
        expect(toggle).not_to_be_checked()
    params = decoded_params(page)
    assert {k: params.get(k) for k in settings} == settings, page.url
    # a rerun from the browser: another colour scale (every page has the sidebar's)
    selectbox = page.locator("section[data-testid='stSidebar'] [data-testid='stSelectbox']", has_text="Colour scale")
    selectbox.scroll_into_view_if_needed()
    selectbox.locator("input").first.click()
    page.keyboard.type("Cividis")
    page.locator("[role='option']", has_text=re.compile("^Cividis$")).click(timeout=15_000)
    page.wait_for_function("() => location.search.includes('colours=Cividis')", timeout=30_000)
    wait_idle(page)
    params = decoded_params(page)
    assert {k: params.get(k) for k in settings} == settings, page.url
    page.reload()
    wait_idle(page)
    params = decoded_params(page)
    assert {k: params.get(k) for k in settings} == settings and params["colours"] == "Cividis", page.url


# Every other page's link (the four above run in the README's tests; these in CI's browser tier,
# marker `layout`, which visits every page): one setting a page keeps, set away from its default,
# and the widget the page drew with it: ("radio", option label), ("checkbox", label) or
# ("number", label, value).
EVERY_OTHER_PAGE = {
    "attention": ({"thumb_scale": "shared"}, ("radio", "one shared scale")),
    "compare": ({"cmp_all": True}, ("checkbox", "All layers")),
    "robustness": ({"rob_perturbation": "noise"}, ("radio", "Gaussian noise")),
    "position": ({"pos_row": 0}, ("number", "Tile row", "0")),
    "filters": ({"filt_mode": "raw"}, ("radio", "raw filters")),
    "distance": ({"dist_unit": "patches"}, ("radio", "patches")),
    "mae": ({"mae_seed": 7}, ("number", "Seed", "7")),
    "text_prompts": ({"tp_mode": "classes"}, ("radio", "class names and a template")),
    "features": ({"feat_mode": "clamp"}, ("radio", "set it to a value (clamp)")),
}
LINKED_IN_THE_README_TESTS = ("tokens", "rollout", "explain", "circuits")


def test_every_page_has_a_link_test():
    from vizapp import views

    assert sorted([*EVERY_OTHER_PAGE, *LINKED_IN_THE_README_TESTS]) == sorted(page.name for page in views.pages())


@pytest.mark.layout
@pytest.mark.parametrize("path", sorted(EVERY_OTHER_PAGE))
def test_a_link_opens_every_other_pages_setting_and_a_reload_keeps_it(page, server, path):
    """As above for the other pages: the page draws its widget with the link's value, the URL keeps
    it after the run, and a reload opens the page with it again."""
    from urllib.parse import urlencode

    from playwright.sync_api import expect

    from vizapp.url_state import encode_setting

    settings, (kind, label, *value) = EVERY_OTHER_PAGE[path]
    url = f"{server}/{'' if path == 'attention' else path}?{urlencode({k: encode_setting(v) for k, v in settings.items()})}"

    def drawn_with_the_link() -> None:
        main = page.locator("[data-testid='stMain']")
        if kind == "radio":
            expect(main.get_by_role("radio", name=label, exact=True)).to_be_checked()
        elif kind == "checkbox":
            expect(main.get_by_role("checkbox", name=label, exact=True)).to_be_checked()
        else:
            expect(main.locator("[data-testid='stNumberInput']", has_text=label).locator("input")).to_have_value(
                value[0]
            )
        params = decoded_params(page)
        assert {k: params.get(k) for k in settings} == settings, page.url

    page.goto(url)
    wait_idle(page)
    assert_no_exception(page, f"{path} from a link")
    drawn_with_the_link()
    page.reload()
    wait_idle(page)
    drawn_with_the_link()
