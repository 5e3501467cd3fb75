"""The Streamable HTTP server side: request checks (`http`), SSE streams with replay (`sse`),
legacy sessions (`session`, `legacy`), and the endpoint that picks the era (`endpoint`)."""
