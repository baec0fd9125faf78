"""Violation messages built from the keyword and the schema's parameters, never from the instance.

Messages go back to the model as retry feedback, so they may quote the schema (a type, a limit, an
enum's options, a required property's name) but never a value the model sent: "must be of type
string", not "123 is not of type string". Both engines' violations are phrased here, so they read
the same whichever engine judged the call.
"""

from __future__ import annotations

from typing import Any

import orjson

_MAX_PARAM = 200  # characters of a quoted schema parameter (a long enum is cut)


def _quote(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= _MAX_PARAM else text[: _MAX_PARAM - 3] + "..."


#: the order a type list is named in, whatever order the schema or an engine gives it
#: (jsonschema-rs reports a type set so): one list reads alike wherever it was read
_TYPE_ORDER = {
    name: at
    for at, name in enumerate(("null", "boolean", "integer", "number", "string", "array", "object"))
}


def _types(value: Any) -> str:
    names = value if isinstance(value, list) else [value]
    ordered = sorted(names, key=lambda name: _TYPE_ORDER.get(name, len(_TYPE_ORDER)))
    return " or ".join(str(name) for name in ordered)


def describe(keyword: str, param: Any = None) -> str:
    """One value-free sentence for a failed keyword; `param` is the keyword's schema value."""
    match keyword:
        case "type":
            return f"must be of type {_types(param)}"
        case "required":
            return f"is a required property {param!r}" if param else "is a required property"
        case "additionalProperties":
            return "is not an allowed property"
        case "unevaluatedProperties":
            return "is not an allowed property (not covered by the schema)"
        case "enum":
            return f"must be one of {_quote(param)}"
        case "const":
            return f"must be {_quote(param)}"
        case "minLength":
            return f"must be at least {param} characters long"
        case "maxLength":
            return f"must be at most {param} characters long"
        case "minimum":
            return f"must be >= {param}"
        case "maximum":
            return f"must be <= {param}"
        case "exclusiveMinimum":
            return f"must be > {param}"
        case "exclusiveMaximum":
            return f"must be < {param}"
        case "multipleOf":
            return f"must be a multiple of {param}"
        case "pattern":
            return f"must match the pattern {_quote(param)}"
        case "minItems":
            return f"must have at least {param} items"
        case "maxItems":
            return f"must have at most {param} items"
        case "additionalItems" | "unevaluatedItems" | "items":
            return "has more items than the schema allows"
        case "uniqueItems":
            return "must not contain duplicate items"
        case "minProperties":
            return f"must have at least {param} properties"
        case "maxProperties":
            return f"must have at most {param} properties"
        case "contains":
            return "must contain at least one item matching the 'contains' schema"
        case "minContains":
            return f"must contain at least {param} items matching the 'contains' schema"
        case "maxContains":
            return f"must contain at most {param} items matching the 'contains' schema"
        case "propertyNames":
            return "has a property name the schema does not allow"
        case "dependencies" | "dependentRequired" | "dependentSchemas":
            return "does not meet a requirement triggered by another property"
        case "anyOf":
            return "must match at least one of the schemas in 'anyOf'"
        case "oneOf":
            return "must match exactly one of the schemas in 'oneOf'"
        case "allOf":
            return "must match every schema in 'allOf'"
        case "not":
            return "must not match the schema in 'not'"
        case "if" | "then" | "else":
            return "does not meet the schema's conditional ('if'/'then'/'else') requirement"
        case "false":
            return "is not allowed here"
        case "contentMediaType":
            return f"must be content of type {_quote(param)}"
        case "contentEncoding":
            return f"must be encoded as {_quote(param)}"
        case _:
            return f"does not satisfy '{keyword}'"
