"""What happens to accounts that other apps record: sent inside the change's transaction, so that a receiver's rows
(the audit log's, audit/receivers.py) commit or roll back with it. Signals rather than calls: the audit app sits
above accounts, and accounts never imports it."""

from __future__ import annotations

from django.dispatch import Signal

# Keyword arguments: user (who acted; None for the system), token (the ApiToken), via (how: "session", "token
# <prefix>", "admin", "command"); token_revoked also revoked_with: the prefix of the token whose revocation took
# this one along ("" for the token asked for). Sent by accounts/actions.py, the one place tokens change.
token_created = Signal()
token_revoked = Signal()
