"""How a report resource answers CSV instead of JSON, one convention for all of them.

``format=csv`` asks for CSV, ``format=json`` (the default) for JSON; without ``format``, an
``Accept`` that names ``text/csv`` and not ``application/json`` asks for CSV too (a
spreadsheet's importer or ``curl -H 'Accept: text/csv'``). Any other format is a 422 on
``$.format``.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response

from api.statements import attachment
from metering.errors import FieldError, validation_error

FORMATS = ("json", "csv")


def wants_csv(request: Request[Any, Any, Any], format: str) -> bool:
    """Whether the request asked for CSV; 422 for a format that is neither."""
    if format not in FORMATS:
        raise validation_error([FieldError("$.format", "invalid_format", "format is json or csv")])
    if format == "csv":
        return True
    accept = request.headers.get("accept", "")
    chose = "format" in request.query_params
    return not chose and "text/csv" in accept and "application/json" not in accept


def csv_download(text: str, filename: str) -> Response[str]:
    """``text`` as a ``text/csv`` attachment named ``filename``."""
    return Response(
        text, media_type="text/csv", headers={"content-disposition": attachment(filename)}
    )
