module github.com/idempotency/idempotency-go

go 1.19

require (
	github.com/gin-gonic/gin v1.8.1
	github.com/go-chi/chi/v5 v5.0.7
	github.com/jackc/pgx/v4 v4.15.0
	github.com/lib/pq v1.10.7
)
