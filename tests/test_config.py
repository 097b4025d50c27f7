"""Settings: layered, typed, every one documented."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from memory_mcp.config import Settings, iter_settings, load_settings
from memory_mcp.dirs import CACHE_ENV, cache_dir
from memory_mcp.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_every_setting_is_documented_with_its_default_in_config_example() -> None:
    text = (REPO / "config.example.toml").read_text(encoding="utf-8")
    example = tomllib.loads(text)
    for info in iter_settings():
        table = example[info.section] if info.section else example
        assert info.key in table, f"{info.dotted} is missing from config.example.toml"
        assert table[info.key] == info.default, f"{info.dotted}: example differs from default"
        assert info.description, f"{info.dotted} has no help string"
    documented = {(s, k) for s, v in example.items() if isinstance(v, dict) for k in v}
    documented |= {("", k) for k, v in example.items() if not isinstance(v, dict)}
    assert documented == {(i.section, i.key) for i in iter_settings()}


def test_the_example_file_loads_as_a_user_config(tmp_path: Path) -> None:
    loaded = load_settings(env={"MEMORY_MCP_CONFIG": str(REPO / "config.example.toml")})
    assert loaded.settings == Settings()


def test_layers_apply_in_order_user_then_project_then_environment(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text(
        "[ranking]\nhalf_life_days = 10\nprior_weight = 0.3\n[search]\ncandidates = 40\n",
        encoding="utf-8",
    )
    project = tmp_path / "repo"
    project.mkdir()
    (project / ".memory-mcp.toml").write_text("[ranking]\nhalf_life_days = 20\n", encoding="utf-8")
    env = {"MEMORY_MCP_CONFIG": str(user), "MEMORY_MCP_SEARCH_CANDIDATES": "70"}
    loaded = load_settings(project_root=project, env=env)
    assert loaded.settings.ranking.half_life_days == 20  # project over user
    assert loaded.settings.ranking.prior_weight == 0.3  # user over default
    assert loaded.settings.search.candidates == 70  # environment over user
    assert loaded.sources == [
        "defaults",
        str(user),
        str(project / ".memory-mcp.toml"),
        "environment",
    ]


def test_the_project_file_names_the_project_and_only_it_may(tmp_path: Path) -> None:
    (tmp_path / ".memory-mcp.toml").write_text(
        '[project]\nid = "acme/app"\n[brief]\nbudget_tokens = 900\n', encoding="utf-8"
    )
    loaded = load_settings(project_root=tmp_path, env={})
    assert loaded.settings.brief.budget_tokens == 900  # project.id is identity's, not a setting
    user = tmp_path / "user.toml"
    user.write_text('[project]\nid = "everything"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="belongs in its own"):
        load_settings(env={"MEMORY_MCP_CONFIG": str(user)})


def test_one_environment_variable_relocates_the_data_directory(tmp_path: Path) -> None:
    loaded = load_settings(env={"MEMORY_MCP_DATA_DIR": str(tmp_path / "elsewhere")})
    assert loaded.settings.database_path() == tmp_path / "elsewhere" / "memory.db"


def test_a_project_file_cannot_redirect_storage_or_embedder_endpoints(tmp_path: Path) -> None:
    (tmp_path / ".memory-mcp.toml").write_text(
        '[embedder]\nopenai_base_url = "https://attacker.example/v1"\n', encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="may only set"):
        load_settings(project_root=tmp_path, env={})


def test_the_cache_folder_is_moved_by_its_variable_which_is_no_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MEMORY_MCP_CACHE_DIR`` moves the cache on every platform (the XDG variables
    only on Linux), and the settings do not refuse it as an unknown variable."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    assert load_settings(env={CACHE_ENV: str(tmp_path / "elsewhere")}).settings == Settings()
    monkeypatch.delenv(CACHE_ENV)
    assert cache_dir() != tmp_path / "elsewhere"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMORY_MCP_SEARCH_CANDIDATES": "many"}, "search.candidates"),
        ({"MEMORY_MCP_RANKING_PRIOR_WEIGHT": "2"}, "ranking.prior_weight"),
        ({"MEMORY_MCP_WRITE_SECRETS": "maybe"}, "write.secrets"),
        ({"MEMORY_MCP_SEARCH_CANDIDATE": "40"}, "unknown environment variable"),
        ({"MEMORY_MCP_CONFIG": "/nonexistent/config.toml"}, "not a file"),
    ],
)
def test_bad_settings_fail_with_a_message_naming_the_setting(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env=env)


def test_unknown_keys_in_a_config_file_are_refused(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text("[ranking]\nhalflife = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"ranking\.halflife"):
        load_settings(env={"MEMORY_MCP_CONFIG": str(user)})


def test_a_malformed_config_file_is_reported_with_its_path(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text("[ranking\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"user\.toml"):
        load_settings(env={"MEMORY_MCP_CONFIG": str(user)})


@pytest.mark.parametrize(
    ("word", "value"), [("no", False), ("off", False), ("yes", True), ("On", True)]
)
def test_boolean_words_in_the_environment(word: str, value: bool) -> None:
    loaded = load_settings(env={"MEMORY_MCP_MAINTENANCE_ENABLED": word})
    assert loaded.settings.maintenance.enabled is value


def test_a_bad_choice_lists_the_choices_and_an_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"embedder\.backend: .*use one of: auto, fastembed"):
        load_settings(env={"MEMORY_MCP_EMBEDDER_BACKEND": "fast"})
    user = tmp_path / "user.toml"
    user.write_text("[serch]\ncandidates = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="serch: unknown setting"):
        load_settings(env={"MEMORY_MCP_CONFIG": str(user)})


def test_an_empty_or_unexpanded_variable_does_not_override_the_config_file(
    tmp_path: Path,
) -> None:
    """A CLI passes "${NAME}" as is when it lacks NAME: the config file's value stands."""
    user = tmp_path / "user.toml"
    user.write_text('[embedder]\nopenai_api_key = "sk-from-file"\n', encoding="utf-8")
    name = "MEMORY_MCP_EMBEDDER_OPENAI_API_KEY"
    for value in ("${" + name + "}", "$" + name, ""):
        loaded = load_settings(env={"MEMORY_MCP_CONFIG": str(user), name: value})
        assert loaded.settings.embedder.openai_api_key == "sk-from-file"
