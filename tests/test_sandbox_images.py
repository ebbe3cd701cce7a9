"""Sandbox images: recipe hashing, image choice, mirror discovery, and the built images themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_fixtures import leftover_containers, require_docker

from sandbox.cli import image_main
from sandbox.env import images
from sandbox.env.images import RECIPES, Recipe, build_image, debian_mirror, select_image


def test_recipe_hash_is_stable_and_content_addressed() -> None:
    a = Recipe("x", ("git", "python3"), check="true")
    assert a.hash == Recipe("x", ("python3", "git"), check="true").hash  # package order does not matter
    assert a.hash != Recipe("x", ("python3", "git", "curl"), check="true").hash
    assert a.hash != Recipe("x", ("git", "python3"), check="true", env={"A": "1"}).hash
    assert len(a.tag) == 12 and a.hash.startswith(a.tag)
    assert len({r.hash for r in RECIPES.values()}) == len(RECIPES) == 3


def test_select_image_precedence() -> None:
    assert select_image(None, "go", "pytest") == "gagar-go:latest"  # language beats framework
    assert select_image(None, None, "junit") == "gagar-java:latest"
    assert select_image(None, None, "unittest") == "gagar-python:latest"
    assert select_image("mine:1", "go", "go") == "mine:1"  # the instance's image beats both
    assert select_image("mine:1", "go", "go", override="cli:2") == "cli:2"  # --image beats everything
    with pytest.raises(images.ImageError, match="--image"):
        select_image(None, "cobol", "cobol-unit")


def test_debian_mirror_from_apt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAGAR_DEBIAN_MIRROR", raising=False)
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n")
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"
    (d / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("# x\ndeb [arch=amd64] http://old.example/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://old.example/debian"
    (tmp_path / "sources.list").write_text("deb http://other.example/ubuntu jammy main\n")
    assert debian_mirror(tmp_path) == images.DEFAULT_MIRROR
    monkeypatch.setenv("GAGAR_DEBIAN_MIRROR", "http://env.example/debian")
    assert debian_mirror(tmp_path) == "http://env.example/debian"


def test_image_build_rejects_unknown_names(capsys: pytest.CaptureFixture) -> None:
    assert image_main(["build", "gagar-cobol"]) == 2
    assert "unknown image" in capsys.readouterr().err
    assert image_main(["build"]) == 2


@pytest.mark.docker
def test_built_images_are_current_and_skipped() -> None:
    require_docker()
    import docker

    client = docker.from_env()
    for recipe in RECIPES.values():
        ref, built = build_image(recipe, client=client, say=lambda _: None)
        assert not built, "an up-to-date image must not be rebuilt"
        img = client.images.get(ref)
        assert img.labels["gagar.recipe"] == recipe.hash
        assert f"{recipe.name}:latest" in img.tags and ref in img.tags
    rows = {r["name"]: r for r in images.list_images(client)}
    assert all(r["status"] == "built" for r in rows.values())
    # The sandbox user exists (uid 1000) and each image passes its own check as that user.
    for recipe in RECIPES.values():
        images._check(client, f"{recipe.name}:{recipe.tag}", recipe)
    out = client.containers.run("gagar-python:latest", ["bash", "-lc", "id -un; ls -ldn /testbed /gagar/report"],
                                remove=True, user="1000", network_mode="none", labels={"gagar.sandbox": "1"})
    lines = out.decode().split("\n")
    assert lines[0] == "sandbox" and all(" 1000 1000 " in ln for ln in lines[1:3])
    assert leftover_containers("image-check") == []


@pytest.mark.docker
@pytest.mark.slow
def test_build_a_minimal_image_from_scratch() -> None:
    require_docker()
    import docker

    client = docker.from_env()
    recipe = Recipe("gagar-test-minbase", ("git",), check="git --version && id -u sandbox")
    try:
        ref, built = build_image(recipe, force=True, client=client, say=lambda _: None)
        assert built and client.images.get(ref).labels["gagar.recipe"] == recipe.hash
        assert build_image(recipe, client=client, say=lambda _: None) == (ref, False)
    finally:
        for tag in (f"{recipe.name}:{recipe.tag}", f"{recipe.name}:latest"):
            try:
                client.images.remove(tag)
            except docker.errors.ImageNotFound:
                pass
