"""Inert local equivalents of the few upstream classes a rollout dump may hold.

miles pickles ``AdapterRef`` and ``RewardSpec`` (frozen dataclasses of ``miles.utils.types``) by
class; slime VLM samples hold PIL images. The safe loader never imports those modules: the names
resolve to stand-ins whose construction gives a :class:`DumpRecord` (the dataclass's fields) or a
:class:`DumpImage` (size, mode, pixels), both filled once from checked pickle state and read-only
afterwards. The stand-in classes themselves cannot be changed by a pickle (``_SealedClass``).
Saved again (``dumps pack``, Ray), they pickle as themselves and load back through the same
allowlist. :meth:`DumpRecord.revive` and :meth:`DumpImage.to_pil` build the real objects, on
request only (they import miles or PIL then).
"""

from __future__ import annotations

import importlib
from typing import Any

from forge_replay.dumps.bounds import quote
from forge_replay.dumps.refusal import Refused

# Upstream dataclasses kept as records: "module.Name" (radixark/miles miles/utils/types.py @ 31f1ca96).
RECORD_CLASSES: frozenset[str] = frozenset({"miles.utils.types.AdapterRef", "miles.utils.types.RewardSpec"})

# PIL classes an image in a dump may be pickled as: Image.Image (convert/resize results) and the
# ImageFile subclasses Image.open returns (PIL's Image.__getstate__/__setstate__ serve all of them).
_PIL_PLUGIN_CLASSES = (
    ("PngImagePlugin", "PngImageFile"),
    ("JpegImagePlugin", "JpegImageFile"),
    ("MpoImagePlugin", "MpoImageFile"),
    ("GifImagePlugin", "GifImageFile"),
    ("BmpImagePlugin", "BmpImageFile"),
    ("BmpImagePlugin", "DibImageFile"),
    ("TiffImagePlugin", "TiffImageFile"),
    ("WebPImagePlugin", "WebPImageFile"),
    ("PpmImagePlugin", "PpmImageFile"),
    ("TgaImagePlugin", "TgaImageFile"),
    ("IcoImagePlugin", "IcoImageFile"),
)
IMAGE_CLASSES: frozenset[str] = frozenset(
    {"PIL.Image.Image", "PIL.ImageFile.ImageFile"} | {f"PIL.{module}.{name}" for module, name in _PIL_PLUGIN_CLASSES}
)

# Bits per pixel of PIL's raw ``tobytes()`` for each mode (mode "1" packs 8 pixels a byte per row).
_MODE_BITS = {
    "1": 1, "L": 8, "P": 8, "LA": 16, "La": 16, "PA": 16, "RGB": 24, "YCbCr": 24, "LAB": 24, "HSV": 24,
    "RGBA": 32, "RGBa": 32, "RGBX": 32, "CMYK": 32, "I": 32, "F": 32,
    "I;16": 16, "I;16L": 16, "I;16B": 16, "I;16N": 16,
}


class _SealedClass(type):
    """Metaclass of every class the loader hands out here: a pickle's BUILD cannot set or delete its attributes."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise Refused(f"the pickle sets attribute {quote(name)} of class {cls.__qualname__}, which is read-only")

    def __delattr__(cls, name: str) -> None:
        raise Refused(f"the pickle deletes attribute {quote(name)} of class {cls.__qualname__}, which is read-only")


class _Inert(metaclass=_SealedClass):
    """State set once, from checked pickle data; read-only afterwards."""

    __slots__ = ("_class", "_filled")
    ALLOWED: frozenset[str] = frozenset()

    def __new__(cls, upstream: str) -> Any:
        if upstream not in cls.ALLOWED:
            raise Refused(f"{cls.__name__} of {quote(upstream)}: not an allowlisted class")
        self = object.__new__(cls)
        object.__setattr__(self, "_class", upstream)
        object.__setattr__(self, "_filled", False)
        return self

    @property
    def upstream_class(self) -> str:
        """The class the dump pickled ("module.Name")."""
        return self._class

    def _fill(self, **values: Any) -> None:
        if self._filled:
            raise Refused(f"the pickle sets the state of {self._class} twice")
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_filled", True)

    def __setattr__(self, name: str, value: Any) -> None:
        raise Refused(f"the pickle sets attribute {quote(name)} of a {self._class}, which is read-only")

    def __delattr__(self, name: str) -> None:
        raise Refused(f"the pickle deletes attribute {quote(name)} of a {self._class}, which is read-only")


class DumpRecord(_Inert):
    """An upstream dataclass instance (miles' ``AdapterRef``, ``RewardSpec``) as its fields.

    Fields read as attributes (``ref.name``, ``ref.slot``) or as :attr:`fields`; equal and hashable
    by class and fields, like the frozen dataclass it stands for.
    """

    __slots__ = ("_values",)
    ALLOWED = RECORD_CLASSES

    def __new__(cls, upstream: str) -> DumpRecord:
        self = super().__new__(cls, upstream)
        object.__setattr__(self, "_values", {})
        return self

    def __setstate__(self, state: Any) -> None:
        # A dataclass pickles its __dict__; one with __slots__ pickles (None, slot values).
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            first, slots = state
            if first is not None and not isinstance(first, dict):
                raise Refused(f"{self._class} state {quote(state)}: expected field values")
            state = {**(first or {}), **slots}
        if not isinstance(state, dict) or not all(isinstance(k, str) and k.isidentifier() for k in state):
            raise Refused(f"{self._class} state {quote(state)}: expected a dict of field values")
        if any(k.startswith("_") for k in state):
            raise Refused(f"{self._class} state {quote(sorted(state))}: fields may not start with '_'")
        self._fill(_values=dict(state))

    @property
    def fields(self) -> dict[str, Any]:
        """The dataclass's field values, by name (a copy)."""
        return dict(self._values)

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails: the fields
        values = object.__getattribute__(self, "_values") if name != "_values" else None
        if values is not None and name in values:
            return values[name]
        raise AttributeError(name)

    def revive(self) -> Any:
        """The real upstream object (imports its module: only where miles is installed and trusted)."""
        module, _, name = self._class.rpartition(".")
        return getattr(importlib.import_module(module), name)(**self._values)

    def __reduce__(self) -> Any:
        return (DumpRecord, (self._class,), dict(self._values))

    def __eq__(self, other: Any) -> bool:
        if type(other) is not DumpRecord:
            return NotImplemented
        return self._class == other._class and self._values == other._values

    def __hash__(self) -> int:
        return hash((self._class, tuple(self._values.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={quote(v, 80)}" for k, v in self._values.items())
        return f"{self._class.rpartition('.')[2]}({inner})"


class DumpImage(_Inert):
    """A PIL image as plain data: ``mode``, ``size``, raw pixel bytes (``Image.tobytes()``), palette, info.

    :meth:`to_pil` builds the PIL image (importing PIL then); nothing of PIL runs at load time.
    """

    __slots__ = ("mode", "size", "data", "palette", "info", "filename")
    ALLOWED = IMAGE_CLASSES

    def __setstate__(self, state: Any) -> None:
        # PIL's Image.__getstate__: [info, mode, size, palette, data], ImageFile's adds the filename.
        if not isinstance(state, (list, tuple)) or len(state) not in (5, 6):
            raise Refused(f"{self._class} state {quote(state)}: expected [info, mode, size, palette, data]")
        info, mode, size, palette, data = state[:5]
        filename = state[5] if len(state) == 6 else None
        if not isinstance(info, dict) or not all(isinstance(k, str) for k in info):
            raise Refused(f"{self._class} info {quote(info)}: expected a dict with string keys")
        if mode not in _MODE_BITS:
            raise Refused(f"{self._class} mode {quote(mode)}: not a plain image mode")
        if not (isinstance(size, tuple) and len(size) == 2 and all(type(n) is int and n >= 0 for n in size)):
            raise Refused(f"{self._class} size {quote(size)}: expected (width, height)")
        if palette is not None and not (isinstance(palette, list) and all(type(v) is int for v in palette)):
            raise Refused(f"{self._class} palette {quote(palette)}: expected a list of ints")
        if filename is not None and not isinstance(filename, str):
            raise Refused(f"{self._class} filename {quote(filename)}: expected a string")
        width, height = size
        expected = (width * _MODE_BITS[mode] + 7) // 8 * height
        if not isinstance(data, bytes) or len(data) != expected:
            got = len(data) if isinstance(data, bytes) else quote(data)
            raise Refused(f"{self._class} of mode {mode} and size {size}: {got} pixel bytes, expected {expected}")
        self._fill(mode=mode, size=size, data=data, palette=palette, info=dict(info), filename=filename)

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    def to_pil(self) -> Any:
        """The PIL image (``PIL.Image.Image``) with these pixels, palette and info; imports PIL."""
        from PIL import Image

        image = Image.frombytes(self.mode, self.size, self.data)
        if self.palette and self.mode in ("L", "LA", "P", "PA"):
            image.putpalette(self.palette)
        image.info.update(self.info)
        return image

    def _state(self) -> list[Any]:
        state = [dict(self.info), self.mode, self.size, self.palette, self.data]
        return state if self.filename is None else [*state, self.filename]

    def __reduce__(self) -> Any:
        return (DumpImage, (self._class,), self._state())

    def __eq__(self, other: Any) -> bool:
        if type(other) is not DumpImage:
            return NotImplemented
        return self._class == other._class and self._state() == other._state()

    __hash__ = None  # type: ignore[assignment]  # like PIL images: compared by value, not hashable

    def __repr__(self) -> str:
        return f"<{self._class} mode={self.mode} size={self.size[0]}x{self.size[1]} (inert)>"


class _UpstreamName(metaclass=_SealedClass):
    """Base of the per-name stand-ins find_class hands out for an upstream class (NEWOBJ needs a type)."""

    __slots__ = ()
    _make: Any = None
    _name = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            raise Refused(f"{cls._name}{quote(args)}: only the pickled field state is allowed")
        return cls._make(cls._name)


def upstream_globals() -> dict[tuple[str, str], Any]:
    """``(module, name)`` -> what the loader hands out: a sealed stand-in per upstream class, and our own
    inert classes (so what ``dumps pack`` writes loads back)."""
    allowed: dict[tuple[str, str], Any] = {
        (__name__, "DumpRecord"): DumpRecord,
        (__name__, "DumpImage"): DumpImage,
    }
    for names, make in ((RECORD_CLASSES, DumpRecord), (IMAGE_CLASSES, DumpImage)):
        for full in sorted(names):
            module, _, name = full.rpartition(".")
            namespace = {"__slots__": (), "_make": make, "_name": full}
            allowed[(module, name)] = _SealedClass(name, (_UpstreamName,), namespace)
    return allowed


def revive(value: Any, seen: dict[int, Any] | None = None) -> Any:
    """``value`` with every inert record and image inside it (dicts, lists, tuples, sets) turned into the real
    upstream object: for handing samples back to slime or miles inside their own process (imports miles / PIL
    there). One inert object met twice (an image in the prompt and in ``multimodal_inputs``; pass the same
    ``seen`` across calls) becomes one object; a list, tuple or set with nothing to revive is returned as is."""
    seen = {} if seen is None else seen
    if isinstance(value, (DumpRecord, DumpImage)):
        if id(value) not in seen:
            seen[id(value)] = value.revive() if isinstance(value, DumpRecord) else value.to_pil()
        return seen[id(value)]
    if isinstance(value, dict):
        return {key: revive(item, seen) for key, item in value.items()}
    if type(value) in (list, tuple, set, frozenset):
        items = [revive(item, seen) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else type(value)(items)
    return value

