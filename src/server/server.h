/*
 * server.h — `kiln serve`: an OpenAI-compatible HTTP server over one kiln session. The entry point the
 * CLI calls; everything else of the server is internal (srv.h).
 */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln.h"

typedef struct srv_config {
    const char *model_path;
    const char *host;           /* address to bind (default 127.0.0.1) */
    int port;                   /* 0: the OS picks one (printed) */
    int parallel;               /* slots = sequences of the session */
    int n_ctx;                  /* positions per slot; 0: the session's default */
    int n_threads;              /* 0: the session's default */
    kiln_device device;
    const char *api_key;        /* NULL or "": no authentication */
    const char *chat_template;  /* NULL: the model's tokenizer.chat_template */
    const char *alias;          /* model id in the API; NULL: the file's base name */
    int max_queue;              /* requests waiting for a slot; more are refused with 503 */
    size_t max_body;            /* request body limit in bytes (413 above it) */
    int timeout_s;              /* idle connection timeout and slow-reader limit */
    int shutdown_grace_s;       /* SIGINT/SIGTERM: how long in-flight requests may still run */
    /* Called on the engine thread once the session is open and warm (prints the open phases). */
    void (*on_open)(const kiln_session *s, unsigned long long open_ns, void *ud);
    void *ud;
} srv_config;

/* Runs the server until SIGINT or SIGTERM: starts the HTTP listener at once (/health answers 503
 * "loading"), opens the model and the session on the engine thread, then serves. Returns the process
 * exit code (0 after a signal, 1 when the listener or the model cannot be opened). */
int srv_run(const srv_config *cfg);

#endif
