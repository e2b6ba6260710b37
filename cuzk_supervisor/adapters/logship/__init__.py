"""Log shipping to the manager: the shipper, its bounded buffer, the push body, and the
structlog processor that feeds it."""
