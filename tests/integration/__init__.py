"""End-to-end tests: real servers on loopback, the real openai SDK and a raw websockets client."""
