"""The OpenAI-compatible API of a deployment (issue 33): `/serve/<deployment>/v1/chat/completions`,
`/v1/completions` and `/v1/models`, for text models with Triton's OpenAI-frontend contract (`text_input` in,
`text_output` out). Parsing (requests.py), the model's inputs (inputs.py), answers and chunks (answers.py) and the
ASGI handler (handler.py); chat templates are rendered by modelport/core/chat_template.py. docs/api.md,
"OpenAI-compatible API", is the user's description."""
