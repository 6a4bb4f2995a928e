"""KV handles and payload tiers indexed in Redis by prefix-hash chains; the SQL registry; events."""
