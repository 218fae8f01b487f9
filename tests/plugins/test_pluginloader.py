"""The plugin loader: resolving names, refusing broken plugins with their name and the reason,
and loading through every way the broker starts (make_broker_service, twistd, postroom serve)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher

from postroom.broker.server import pluginloader
from postroom.broker.server.pluginloader import PluginError, available_plugins, load_plugins
from postroom.broker.server.service import make_broker_service
from postroom.broker.tools.tap import Options, makeService
from postroom.config.loader import loads
from postroom.config.schema import PluginConfig
from postroom.config.values import ConfigError

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
from twisted.plugin import IPlugin
from zope.interface import implementer
from postroom.broker.interfaces import IBrokerPlugin, PluginSettingsInvalid

@implementer(IPlugin, IBrokerPlugin)
class Plugin:
    name = "{name}"
    description = "a test plugin"
    requires = {requires!r}
    installed = []

    def check_settings(self, settings):
        if settings.get("colour", "red") not in ("red", "blue"):
            raise PluginSettingsInvalid("colour: must be red or blue, not " + repr(settings["colour"]))
        return settings

    def install(self, context, settings):
        self.installed.append(settings)

plugin = Plugin()
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path for plugin modules written by the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("pr_test_")]:
        del sys.modules[name]


def write(directory: Path, module: str, text: str) -> None:
    (directory / f"{module}.py").write_text(textwrap.dedent(text))


def load_yaml(text: str) -> Any:
    config = loads(textwrap.dedent(text), "broker.yaml")
    return load_plugins(config.plugins, source=config.source)


def test_bundled_plugins_are_found_by_short_name() -> None:
    names = {plugin.name: plugin.origin for plugin in available_plugins()}
    assert names == {"delayed_message": "bundled", "consistent_hash": "bundled"}
    loaded = load_yaml("plugins: [delayed_message, consistent_hash]\n")
    assert loaded.names == ["delayed_message", "consistent_hash"]
    assert {"x-delayed-message", "x-consistent-hash"} <= set(loaded.registry.names())
    assert loaded.hooks is None  # nothing for the hot path to call


def test_each_loaded_plugin_is_logged_with_where_it_came_from() -> None:
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        load_yaml("plugins: [consistent_hash]\n")
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [event for event in events if event.get("plugin") == "consistent_hash"]
    assert len(lines) == 1
    assert lines[0]["origin"] == "bundled module postroom.plugins.consistent_hash"
    assert lines[0]["log_format"].startswith("plugin {plugin} loaded from {origin}")


def test_a_dotted_module_path_is_loaded_with_its_settings(modules: Path) -> None:
    write(modules, "pr_test_good", GOOD.format(name="good", requires=()))
    loaded = load_yaml("plugins:\n  - {name: pr_test_good, settings: {colour: blue}}\n")
    assert loaded.names == ["good"]
    assert loaded.plugins[0][1] == "module pr_test_good"
    assert loaded.plugins[0][0].installed == [{"colour": "blue"}]


def test_a_missing_module_stops_start_up_naming_the_plugin_and_the_line() -> None:
    with pytest.raises(PluginError) as excinfo:
        load_yaml("storage: {fsync: batch}\nplugins: [delayed_message, no_such_plugin]\n")
    assert isinstance(excinfo.value, ConfigError)
    assert str(excinfo.value).splitlines()[1] == (
        "  broker.yaml:2: plugins[1]: plugin 'no_such_plugin': no bundled plugin, 'postroom.plugins' entry point "
        "or module of that name (bundled: consistent_hash, delayed_message)"
    )


def test_a_module_that_fails_to_import_is_reported_with_its_error(modules: Path) -> None:
    write(modules, "pr_test_broken", "import no_such_dependency_xyz\n")
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_broken]\n")
    assert excinfo.value.reason == (
        "module 'pr_test_broken' fails to import: ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    )
    write(modules, "pr_test_raises", "raise RuntimeError('boom at import')\n")
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_raises]\n")
    assert excinfo.value.reason == "module 'pr_test_raises' fails to import: RuntimeError: boom at import"


def test_an_object_without_the_interface_is_refused(modules: Path) -> None:
    write(modules, "pr_test_wrong", GOOD.format(name="wrong", requires=()).replace("    def install", "    def setup"))
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_wrong]\n")
    assert "does not provide IBrokerPlugin" in excinfo.value.reason
    assert "install" in excinfo.value.reason
    write(modules, "pr_test_empty", "x = 1\n")
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_empty]\n")
    assert excinfo.value.reason == (
        "module 'pr_test_empty' has 0 objects providing IBrokerPlugin and no 'plugin' attribute (expected exactly one)"
    )


def test_bad_settings_stop_start_up_with_the_plugins_reason(modules: Path) -> None:
    write(modules, "pr_test_good", GOOD.format(name="good", requires=()))
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins:\n  - name: pr_test_good\n    settings: {colour: green}\n")
    assert str(excinfo.value).splitlines()[1] == (
        "  broker.yaml:2: plugins[0]: plugin 'pr_test_good': invalid settings: colour: must be red or blue, not 'green'"
    )
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [{name: delayed_message, settings: {max_delay: forever}}]\n")
    assert "plugin 'delayed_message': invalid settings: max_delay: must be a duration" in str(excinfo.value)


def test_dependencies_must_be_listed_first(modules: Path) -> None:
    write(modules, "pr_test_base", GOOD.format(name="base", requires=()))
    write(modules, "pr_test_top", GOOD.format(name="top", requires=("base",)))
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_top, pr_test_base]\n")
    assert excinfo.value.reason == "requires 'base': list it before 'pr_test_top' under plugins:"
    assert load_yaml("plugins: [pr_test_base, pr_test_top]\n").names == ["base", "top"]


def test_an_exchange_type_name_taken_twice_is_refused(modules: Path) -> None:
    write(
        modules,
        "pr_test_topic",
        GOOD.format(name="topic2", requires=()).replace(
            "self.installed.append(settings)",
            "from postroom.exchanges.topic import TopicExchangeType; context.add_exchange_type(TopicExchangeType())",
        ),
    )
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [pr_test_topic]\n")
    assert excinfo.value.reason == "failed to install: ValueError: exchange type 'topic' is already registered"


def test_installed_packages_are_found_through_entry_points(modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(modules, "pr_test_packaged", GOOD.format(name="packaged", requires=()))
    entry_points = [
        importlib.metadata.EntryPoint("packaged", "pr_test_packaged:plugin", pluginloader.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("broken", "pr_test_missing_module:plugin", pluginloader.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(pluginloader, "_entry_points", lambda: entry_points)
    listed = {plugin.name: plugin for plugin in available_plugins()}
    assert listed["packaged"].origin == "entry point pr_test_packaged:plugin"
    assert listed["packaged"].description == "a test plugin"
    assert listed["broken"].description.startswith("(broken: ModuleNotFoundError")
    assert load_yaml("plugins: [packaged]\n").plugins[0][1] == "entry point pr_test_packaged:plugin"
    with pytest.raises(PluginError) as excinfo:
        load_yaml("plugins: [broken]\n")
    assert excinfo.value.reason.startswith("entry point pr_test_missing_module:plugin fails to import")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("plugins: delayed_message\n", "broker.yaml:1: plugins: must be a list, not a string 'delayed_message'"),
        ("plugins: [7]\n", "broker.yaml:1: plugins[0]: must be a string, not an integer 7 (quote it)"),
        ("plugins: [a, a]\n", "broker.yaml:1: plugins[1]: plugin 'a' is listed twice"),
        ("plugins: ['x y']\n", "broker.yaml:1: plugins[0]: 'x y' is not a plugin name or a dotted module path"),
        (
            "plugins:\n  - {name: a, setting: {}}\n",
            "broker.yaml:2: plugins[0].setting: unknown key (expected one of: name, settings)",
        ),
        ("plugins:\n  - {settings: {}}\n", "broker.yaml:2: plugins[0]: missing required key 'name'"),
        ("plugins:\n  - {name: a, settings: [1]}\n", "broker.yaml:2: plugins[0].settings: must be a mapping"),
    ],
)
def test_the_plugins_key_is_validated_strictly(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        loads(text, "broker.yaml")
    assert any(line.strip().startswith(problem) for line in str(excinfo.value).splitlines()), str(excinfo.value)


def test_both_forms_of_the_plugins_key_give_names_and_settings() -> None:
    config = loads("plugins:\n  - delayed_message\n  - {name: my.plugin, settings: {a: 1}}\n", "broker.yaml")
    assert config.plugins == (PluginConfig("delayed_message"), PluginConfig("my.plugin", {"a": 1}))
    assert config.plugins[1].line == 3


def test_make_broker_service_loads_the_configurations_plugins() -> None:
    config = loads("plugins: [delayed_message, consistent_hash]\n", "broker.yaml")
    service = make_broker_service(MemoryReactorClock(), config, persist=False)
    assert {"x-delayed-message", "x-consistent-hash"} <= set(service.factory.node.registry.names())
    assert service.factory.node.hooks is None


def test_twistd_refuses_to_start_with_a_broken_plugin(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("plugins: [consistent_hash, nothing_here]\n")
    options = Options()
    options.parseOptions(["--config", str(path)])
    with pytest.raises(SystemExit) as excinfo:
        makeService(options)
    assert f"{path}:1: plugins[1]: plugin 'nothing_here': no bundled plugin" in str(excinfo.value)


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_serve_refuses_to_start_with_bad_plugin_settings(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("plugins:\n  - {name: delayed_message, settings: {max_delay: 90d}}\n")
    result = postroom("serve", "--config", str(path))
    assert result.returncode == 2
    assert (
        f"{path}:2: plugins[0]: plugin 'delayed_message': invalid settings: max_delay: must be between 1ms"
        in result.stderr
    )


def test_postroom_plugins_lists_available_and_enabled_plugins(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("plugins: [consistent_hash]\n")
    result = postroom("plugins", "--config", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "available:"
    assert any(line.split()[0] == "delayed_message" and line.endswith("[bundled]") for line in lines[1:3])
    assert lines[3] == f"enabled by {path}:"
    assert lines[4].startswith("  consistent_hash (bundled module postroom.plugins.consistent_hash): x-consistent-hash")


def test_config_check_loads_the_plugins_and_their_exchange_types(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(
        "plugins: [delayed_message]\n"
        'vhosts:\n  "/":\n    exchanges:\n'
        "      - {name: later, type: x-delayed-message, arguments: {x-delayed-type: direct}}\n"
    )
    result = postroom("config", "check", str(path))
    assert (result.returncode, result.stderr) == (0, "")
    path.write_text(path.read_text().replace("x-delayed-type: direct", "x-delayed-type: nonesuch"))
    result = postroom("config", "check", str(path))
    assert result.returncode == 1
    assert "vhosts./.exchanges[0]: refused by the broker: invalid arguments for exchange 'later'" in result.stderr


SERVICE = """
from twisted.application.service import Service
from twisted.plugin import IPlugin
from zope.interface import implementer
from postroom.broker.interfaces import IBrokerPlugin

@implementer(IPlugin, IBrokerPlugin)
class Plugin:
    name = "with_service"
    description = "runs a service"
    requires = ()

    def check_settings(self, settings):
        return settings

    def install(self, context, settings):
        self.service = Service()
        self.service.setName("tally-flusher")
        self.nodes = []
        context.add_service(self.service)
        context.when_ready(lambda node, snapshot: self.nodes.append((node, snapshot)))

plugin = Plugin()
"""


def test_plugin_services_start_before_the_listeners_and_stop_with_the_broker(modules: Path) -> None:
    write(modules, "pr_test_service", SERVICE)
    config = loads("plugins: [pr_test_service]\nlisten: {metrics: false, management: false}\n", "broker.yaml")
    reactor = MemoryReactorClock()
    service = make_broker_service(reactor, config, amqp_endpoints=["tcp:5673:interface=127.0.0.1"], persist=False)
    plugin = sys.modules["pr_test_service"].plugin
    assert plugin.nodes == [(service.factory.node, None)]
    children = list(service)
    assert children[0] is plugin.service
    # (the shovels last: one to amqp:// connects to the listeners, and they stop first)
    assert [type(child).__name__ for child in children[1:]] == ["ResourceMonitor", "Listener", "Shovels"]
    service.startService()
    assert plugin.service.running
    assert [port for port, *_ in reactor.tcpServers] == [5673]
    service.stopService()
    assert not plugin.service.running


def test_discovery_imports_no_plugins_folder_of_another_distribution(tmp_path: Path) -> None:
    """A top-level ``plugins/`` folder elsewhere on sys.path (no ``__init__.py``, as a namespace
    or Twisted plugin folder has none) is never scanned: its modules are not imported."""
    foreign = tmp_path / "plugins"
    foreign.mkdir()
    marker = tmp_path / "imported"
    (foreign / "someone_elses.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.append({str(tmp_path)!r})
        from postroom.broker.server.pluginloader import available_plugins, find_plugin
        names = [plugin.name for plugin in available_plugins()]
        find_plugin("delayed_message")
        print(names)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "delayed_message" in result.stdout and "consistent_hash" in result.stdout
    assert not marker.exists()
