# Multi-stage build of the hub: a static binary on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build context has no .git (.dockerignore), so Go cannot stamp the VCS
# revision itself: pass it, or `marconi version` says "revision unknown".
#   docker build --build-arg REVISION=$(git rev-parse HEAD) .
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.revision=${REVISION}" -o /out/marconi ./cmd/marconi

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/marconi /marconi
EXPOSE 8080
ENTRYPOINT ["/marconi"]
CMD ["serve"]
