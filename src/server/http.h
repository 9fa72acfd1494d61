/*
 * http.h — the libmicrohttpd side shared by http.c (daemon, bodies, streaming) and api.c (routes).
 */
#ifndef KILN_SERVER_HTTP_H
#define KILN_SERVER_HTTP_H

#include <microhttpd.h>

#include "server/srv.h"

/* One HTTP request: its body as it arrives and, for generation requests, its job. */
typedef struct req_ctx {
    uint64_t t_arrive;
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;              /* a response is queued (an early 413): later calls only drain */
    size_t discarded;
    int route;                  /* SRV_ROUTE_* for the metrics */
    srv_job *job;
} req_ctx;

/* Routes a request whose body is complete. */
enum MHD_Result api_handle(srv *S, req_ctx *c, struct MHD_Connection *conn, const char *url, const char *method);
/* A non-streamed generation request whose connection was resumed: answers it when its job is done. */
enum MHD_Result api_resumed(srv *S, req_ctx *c, struct MHD_Connection *conn);

/* Responses; each counts the request in the metrics under c->route. */
enum MHD_Result http_json(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, json_t *j); /* steals j */
enum MHD_Result http_error(srv *S, req_ctx *c, struct MHD_Connection *conn, const srv_error *e);
enum MHD_Result http_text(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, const char *ctype,
                          const char *text, size_t len, bool copy);
/* Queues the SSE response of c->job (the job's events are produced as the engine generates). */
enum MHD_Result http_stream(srv *S, req_ctx *c, struct MHD_Connection *conn);

#endif
