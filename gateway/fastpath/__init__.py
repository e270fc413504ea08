"""The gateway's JSON fast path, and the plain version it must agree with.

- depth.py: the depth check of a request's JSON, in numpy and bytes passes (no Python loop over the bytes);
- json_body.py: the request checked on simdjson's tape, its FP32 and integer data sent on as binary (transcoding),
  and the passed checks of binary requests' headers kept (HeaderChecks);
- body_pieces.py: a request's body kept by the web server (portal/web_server.py) as the pieces it came in, where
  uvicorn copies each into a bytearray and the whole into bytes;
- reference.py: the same checks done plainly (a regex over strings for the depth, json.loads for the rest, the
  body forwarded as sent). The property tests compare the fast path with it, and GATEWAY_JSON_FAST_PATH=false makes
  the gateway use it and the web server keep uvicorn's own bytearray (docs/configuration.md).
"""
