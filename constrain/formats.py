"""Regular expressions for the JSON-Schema formats llguidance 1.9.1 has no matcher for, each the exact language of
its RFC's grammar (every one of these grammars is regular; `uri` and `iri` with a hier-part, as ajv's), for the
dates and times its matchers take too loosely, for e-mail addresses and URIs, which it takes more widely than
validators do, and for IPv6 addresses, which it takes too narrowly (not those ending in an IPv4 address,
`::ffff:1.2.3.4`), and for durations, held to what Python's timedelta holds. constrain/rewrite.py turns such a
`format` into the equivalent `pattern`, so both backends enforce it instead of refusing the schema. `URI`,
`HOSTNAME`, `DURATION` and the IP addresses also serve the tool formats whose string values are raw text
(constrain/xml_calls.py), where llguidance's checks of JSON strings do not reach.

Written in the common subset of ECMA-262, Rust's regex and Python's re: classes, `(?:...)`, counted repeats, no
look-around; non-ASCII ranges are literal characters. `idn-hostname` and `idn-email` are the part of their
languages a grammar states (IDNA's rules for labels of other scripts are not one). Not here: `regex` (ECMA-262
regexes nest, so no regular expression describes them).
"""

from __future__ import annotations

_HEX = "[0-9A-Fa-f]"
_PCT = f"%{_HEX}{_HEX}"
_UNRESERVED = "A-Za-z0-9\\-._~"
_SUB_DELIMS = "!$&'()*+,;="
# RFC 3987: the non-ASCII characters an IRI may hold, and those only its query may hold.
_UCSCHAR = ("\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd\U00020000-\U0002fffd"
            "\U00030000-\U0003fffd\U00040000-\U0004fffd\U00050000-\U0005fffd\U00060000-\U0006fffd"
            "\U00070000-\U0007fffd\U00080000-\U0008fffd\U00090000-\U0009fffd\U000a0000-\U000afffd"
            "\U000b0000-\U000bfffd\U000c0000-\U000cfffd\U000d0000-\U000dfffd\U000e1000-\U000efffd")
_IPRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"

_DEC_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])"
IPV4 = f"{_DEC_OCTET}(?:\\.{_DEC_OCTET}){{3}}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"
IPV6 = "(?:" + "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"


def _reference(iri: bool, absolute: bool) -> str:
    """RFC 3986 URI / URI-reference, or with `iri` RFC 3987 IRI / IRI-reference."""
    unreserved = _UNRESERVED + (_UCSCHAR if iri else "")
    plain = f"[{unreserved}{_SUB_DELIMS}]|{_PCT}"  # unreserved / pct-encoded / sub-delims
    pchar = f"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    query_char = f"(?:[{unreserved}{_IPRIVATE if iri else ''}{_SUB_DELIMS}:@/?]|{_PCT})"
    fragment_char = f"(?:[{unreserved}{_SUB_DELIMS}:@/?]|{_PCT})"
    ip_literal = f"\\[(?:{IPV6}|v{_HEX}+\\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\\]"
    host = f"(?:{ip_literal}|(?:{plain})*)"  # reg-name covers IPv4address
    authority = f"(?:(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*@)?{host}(?::[0-9]*)?"
    path_abempty = f"(?:/{pchar}*)*"
    path_absolute = f"/(?:{pchar}+(?:/{pchar}*)*)?"
    path_rootless = f"{pchar}+(?:/{pchar}*)*"
    path_noscheme = f"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})+(?:/{pchar}*)*"
    tail = f"(?:\\?{query_char}*)?(?:#{fragment_char}*)?"
    hier = f"(?://{authority}{path_abempty}|{path_absolute}|{path_rootless})"
    scheme = "[A-Za-z][A-Za-z0-9+\\-.]*:"
    if absolute:
        # RFC 3986 also takes an empty hier-part (`a:`, `a:?q`), which ajv's `uri` refuses and no answer needs.
        return f"{scheme}{hier}{tail}"
    relative = f"(?://{authority}{path_abempty}|{path_absolute}|{path_noscheme})?{tail}"
    return f"(?:{scheme}{hier}?{tail}|{relative})"


def _uri_template() -> str:
    """RFC 6570 level 4: literals and `{op var,var:3,list*}` expressions."""
    literal = (f"(?:[!#$&(-;=?-\\[\\]_a-z~{_UCSCHAR}{_IPRIVATE}]|{_PCT})")
    varchar = f"(?:[A-Za-z0-9_]|{_PCT})"
    varspec = f"{varchar}(?:\\.?{varchar})*(?::[1-9][0-9]{{0,3}}|\\*)?"
    expression = f"\\{{[+#./;?&=,!@|]?{varspec}(?:,{varspec})*\\}}"
    return f"(?:{literal}|{expression})*"


_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"

# RFC 3339 dates and times as Python's datetime (and so pydantic and jsonschema) reads them: the RFC's grammar with
# the calendar's days per month (February 29 in leap years only), but no year 0000, no leap second (:60) and only
# the upper-case T and Z. Stricter than the RFC, never looser; llguidance's own take February 31 and year 0000
# (which its shortest completion writes: "0000-01-01").
_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

URI = _reference(iri=False, absolute=True)
# RFC 1123 host names as llguidance's own `hostname` check reads them: dot-separated labels of 1 to 63 letters, digits
# and hyphens, neither first nor last a hyphen (no bound on the whole name's length, nor a trailing dot).
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = f"{_LABEL}(?:\\.{_LABEL})*"


def _duration(y: str, mo: str, w: str, d: str, h: str, mi: str, s: str) -> str:
    """RFC 3339's durations (its Appendix A): "P" and the date's parts in order, each with the ones below it, then
    the time's, or weeks alone; every part a whole number of the digits given."""
    time = f"T(?:{h}H(?:{mi}M(?:{s}S)?)?|{mi}M(?:{s}S)?|{s}S)"
    return f"P(?:(?:{d}D|{mo}M(?:{d}D)?|{y}Y(?:{mo}M(?:{d}D)?)?)(?:{time})?|{time}|{w}W)"


DURATION = _duration(*["[0-9]+"] * 7)
# The durations Python's timedelta (behind pydantic) holds: pydantic reads each part as at most 2**32 - 1, the time's
# together as seconds within it, the whole within 999,999,999 days; `P7822699Y` and `PT99999999H` are RFC 3339
# durations it refuses (QA schemagen F1). Parts of at most 4, 5, 5, 6 digits (years, months, weeks, days) and 5, 6,
# 9 (hours, minutes, seconds) stay within all three (at most ~7.7 million days, ~1.4e9 seconds).
PYTHON_DURATION = _duration("[0-9]{1,4}", "[0-9]{1,5}", "[0-9]{1,5}", "[0-9]{1,6}", "[0-9]{1,5}", "[0-9]{1,6}",
                            "[0-9]{1,9}")

# E-mail addresses every validator takes: dot-separated atoms of letters, digits and `_%+-`, at a domain of two or
# more host-name labels whose last is letters. RFC 5321 also allows quoted local parts, single-label domains and
# address literals (`a@b`, `"x y"@b.c`, `a@[1.2.3.4]`), which llguidance's own check takes and ajv's and
# email-validator's (behind pydantic's EmailStr) refuse; jsonschema only looks for the `@`. (Labels are not held to
# 63 characters here: counted, the automata of a schema's patterns grow past the checks' limits.)
EMAIL = "[A-Za-z0-9_%+-]+(?:\\.[A-Za-z0-9_%+-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,}"

# Internationalized host names (RFC 5890), written as their ASCII labels: what IDNA's rules take of host-name labels
# (no `--` in a label's third and fourth places, which A-labels hold), held to 253 characters by the rewrite
# (constrain/rewrite.py). A label of other scripts has rules no grammar states (IDNA's per-character properties,
# contexts, bidi): none is written, so every name is one any IDNA validator (Python's idna, behind jsonschema) takes.
_IDN_LABEL = ("(?:[A-Za-z0-9](?:[A-Za-z0-9-]?[A-Za-z0-9])?"
              "|[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9-][A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?"
              "|[A-Za-z0-9]-[A-Za-z0-9-]{0,58}[A-Za-z0-9]))")
IDN_HOSTNAME = f"{_IDN_LABEL}(?:\\.{_IDN_LABEL})*"
# Internationalized addresses (RFC 6531): `EMAIL` whose local part may also hold any non-ASCII character an IRI may
# (`_UCSCHAR`; RFC 6531 takes any UTF-8 there). The domain stays ASCII, as `IDN_HOSTNAME`'s. (jsonschema only
# looks for the `@`: `"a b@"` passed, which no mail system takes.)
IDN_EMAIL = (f"[A-Za-z0-9_%+\\-{_UCSCHAR}]+(?:\\.[A-Za-z0-9_%+\\-{_UCSCHAR}]+)*"
             "@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,}")

def _base64(last_two: str) -> str:
    """pydantic's `Base64Bytes` and `Base64Str` are both `format: base64` (`base64url`: `-_` for `+/`), and
    `Base64Str` also wants UTF-8 inside: padded base64 of ASCII text, which a reader of either takes. Four characters
    hold three bytes; a byte's top bit is zero where the first three come from the sets below."""
    first, second, third = "[A-Za-f]", "[A-HQ-Xg-nw-z0-3]", "[ABEFIJMNQRUVYZcdghklopstwx014589]"
    return (f"(?:{first}{second}{third}[A-Za-z0-9{last_two}])*"
            f"(?:{first}[AQgw]==|{first}{second}[AEIMQUYcgkosw048]=)?")


_IPV4_INTERFACE = f"{IPV4}(?:/(?:3[0-2]|[12]?[0-9]))?"
_IPV6_INTERFACE = f"{IPV6}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"

# format name -> the regex its strings match in full
FORMAT_PATTERNS = {
    "email": EMAIL,
    "idn-email": IDN_EMAIL,
    "ipv6": IPV6,
    "idn-hostname": IDN_HOSTNAME,
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uri": URI,
    "uri-reference": _reference(iri=False, absolute=False),
    "iri": _reference(iri=True, absolute=True),
    "iri-reference": _reference(iri=True, absolute=False),
    "uri-template": _uri_template(),
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
    "duration": PYTHON_DURATION,  # (a part of RFC 3339's: constrain/rewrite.py `_PART_PATTERNS`)
    # Formats pydantic names for the types it checks more closely than JSON Schema's formats say (`UUID4`,
    # `IPvAnyAddress`): to JSON Schema annotations, which any string satisfies, so written only where a value must
    # hold them (constrain/rewrite.py `_format`). pydantic checks a UUID's version, which Python's
    # `uuid.UUID` reads only under RFC 4122's variant (`8`-`b` first in the fourth group).
    **{f"uuid{v}": f"[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-[0-9a-fA-F]{{12}}"
       for v in range(1, 9)},
    "ipvanyaddress": f"(?:{IPV4}|{IPV6})",
    # (an interface: an address and its prefix length; a network's address must also have no bits set past its
    # prefix, which no short pattern states: `ipvanynetwork` and the like stay annotations)
    "ipv4interface": _IPV4_INTERFACE,
    "ipv6interface": _IPV6_INTERFACE,
    "ipvanyinterface": f"(?:{_IPV4_INTERFACE}|{_IPV6_INTERFACE})",
    "base64": _base64("+/"),
    "base64url": _base64("_\\-"),
}
# The formats above that JSON Schema does not define (pydantic's)
LIBRARY_FORMATS = frozenset({*(f"uuid{v}" for v in range(1, 9)), "ipvanyaddress", "ipv4interface", "ipv6interface",
                             "ipvanyinterface", "base64", "base64url"})


# Formats llguidance checks itself, but only inside JSON strings, as patterns for where its checks do not reach
# (raw text values, constrain/xml_calls.py; object keys, `propertyNames`): a UUID's hex groups (RFC 4122, as
# Python's `uuid.UUID` and jsonschema read one), IPv4 addresses (dotted quads without leading zeros, which Python's
# `ipaddress`, behind jsonschema's check, refuses), durations and host names.
NATIVE_FORMAT_PATTERNS = {
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": IPV4, "duration": DURATION, "hostname": HOSTNAME,
}


def format_pattern(name: str) -> str | None:
    """An anchored `pattern` for format `name`, or None when the backends need no help with it."""
    body = FORMAT_PATTERNS.get(name)
    return None if body is None else f"^{body}$"
