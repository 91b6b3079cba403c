/**
 * consoleMcpUrl is the console's MCP endpoint for its public URL: the one resource the
 * authorization server issues tokens for (RFC 8707), so the audience every access token is
 * bound to and the `resource` the MCP resource server passes to the verifier.
 */
export function consoleMcpUrl(publicUrl: string): string {
  return `${publicUrl}/mcp`;
}
