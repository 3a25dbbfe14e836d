"""Media input (images, audio) for multimodal models: what a request carries to the
engine (`item`), and how untrusted bytes from the API become it (validation, decoding,
fetching). A low layer: the engine and the server import it, it imports neither."""
