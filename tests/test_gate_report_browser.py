"""The gate report's HTML page in a real browser: headless Chromium (Debian's ``chromium``
package, installed by scripts/install-system-deps.sh) opens the page of a real lab run and takes
a screenshot; the PNG has the window's size and shows the page (many colours, the status colours
among them), not a blank or an error page. Chromium also prints it to PDF, as people do to sign.

The PNG is read with the standard library (zlib; the five PNG row filters of the PNG spec,
section 9), as Pillow is not a dependency.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from test_gate_report import make_runs

from fxkit.gate.html import COLOURS, print_to_pdf, screenshot

pytestmark = pytest.mark.lab

SIZE = (1280, 2000)


def png_rows(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of pixels (RGB, 3 bytes each) of an 8-bit RGB or RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert (depth, interlace) == (8, 0) and colour_type in (2, 6), header
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride, prev, rows = width * bpp, bytearray(width * bpp), []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride) if kind else ():
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(b"".join(bytes(line[i : i + 3]) for i in range(0, stride, bpp)))
        prev = line
    return width, height, rows


def colours(row: bytes) -> set[bytes]:
    """The distinct colours of a row of RGB pixels."""
    return {row[i : i + 3] for i in range(0, len(row), 3)}


def png_pixels(path: Path) -> tuple[int, int, set[bytes]]:
    """Width, height and the distinct colours (RGB) of an 8-bit RGB or RGBA PNG."""
    width, height, rows = png_rows(path)
    return width, height, set().union(*(colours(row) for row in rows))


def need_chromium() -> None:
    if shutil.which("chromium") is None:
        if os.geteuid() != 0:
            pytest.skip(
                "chromium is not installed and we are not root to install it: "
                "run scripts/install-system-deps.sh as root (Debian's chromium)"
            )
        pytest.fail("chromium is not installed: run scripts/install-system-deps.sh (CI does)")


@pytest.fixture(scope="module")
def report(lab_fleet, tmp_path_factory) -> Path:
    need_chromium()
    return make_runs(lab_fleet(2), tmp_path_factory.mktemp("browser"))["second"].files["html"]


def test_html_report_renders_in_headless_chromium(report, tmp_path):
    png = tmp_path / "report.png"
    screenshot(report, png, SIZE)
    width, height, colours = png_pixels(png)
    assert (width, height) == SIZE
    assert len(colours) > 100, f"only {len(colours)} colours: a blank or an error page"
    rgb = {name: bytes.fromhex(colour[1:]) for name, colour in COLOURS.items()}
    assert rgb["PASS"] in colours and rgb["FAIL"] in colours and rgb["WARN"] in colours


def test_html_report_prints_to_pdf(report, tmp_path):
    pdf = tmp_path / "report.pdf"
    print_to_pdf(report, pdf)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-")
    pages = re.findall(rb"/Type\s*/Page(?!s)", data)
    assert 2 <= len(pages) <= 12, f"{len(pages)} pages"
