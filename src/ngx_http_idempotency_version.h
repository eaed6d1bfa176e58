/*
 * The module's version: the one place it is written.  Packaging, the status
 * handler and the nginx -V style banner read it from here.
 */

#ifndef _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_


#define NGX_HTTP_IDEMPOTENCY_VERSION  "0.1.0"


#endif /* _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_ */
